#!/usr/bin/env bash
# Builds and tests the runtime image's Maven project. Offline after the first successful run.
#   ./build.sh                  # all tests + jars (mvn verify)
#   ./build.sh -DskipTests package
set -euo pipefail
cd "$(dirname "$0")"

java_major() { "$1/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if [ -z "${JAVA_HOME:-}" ] || [ "$(java_major "$JAVA_HOME" 2>/dev/null || echo 0)" -lt 25 ]; then
  for d in /usr/lib/jvm/*; do
    if [ -x "$d/bin/javac" ] && [ "$(java_major "$d")" -ge 25 ] 2>/dev/null; then export JAVA_HOME="$d"; break; fi
  done
fi
if [ -z "${JAVA_HOME:-}" ] || [ "$(java_major "$JAVA_HOME")" -lt 25 ]; then
  echo "build.sh: need a JDK 25 (set JAVA_HOME)" >&2; exit 1
fi
command -v mvn >/dev/null || { echo "build.sh: need Maven (apt-get install maven)" >&2; exit 1; }

args=("$@"); [ ${#args[@]} -eq 0 ] && args=(verify)
# offline once the local repository has what the build needs (after the first online run)
repo="${MAVEN_REPO:-$HOME/.m2/repository}"
pv=$(sed -n 's#.*<graalvm.polyglot.version>\(.*\)</graalvm.polyglot.version>.*#\1#p' pom.xml)
# the mark names the poms it was made with: a dependency added since is fetched online first
mark="$repo/.cpuslot-runtime-deps-$(cat pom.xml */pom.xml | sha256sum | cut -c1-16)"
offline=()
if [ -f "$repo/org/graalvm/polyglot/polyglot/$pv/polyglot-$pv.jar" ] && [ -f "$mark" ]; then offline=(-o); fi
mvn -B "${offline[@]}" "${args[@]}"
if [[ " ${args[*]} " == *" verify "* || " ${args[*]} " == *" install "* ]]; then touch "$mark"; fi
