#!/usr/bin/env bash
# helm post-renderer for the openwhisk-deploy-kube chart: reads the rendered
# chart on stdin, applies kustomize/ (action pod template with the cpuslot
# socket volume, CPUSLOT_SOCKET, cpuslot runtime kinds, intra-container
# concurrency settings) and writes the result to stdout. Needs kubectl
# (its built-in kustomize).
#
#   helm install owdev ./helm/openwhisk -n openwhisk -f deploy/openwhisk/mycluster.yaml \
#     --post-renderer deploy/openwhisk/post-render.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here"/kustomize/* "$work"/
cat >"$work/openwhisk.yaml"
kubectl kustomize "$work"
