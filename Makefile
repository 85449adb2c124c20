# cpuslot: per-invocation CPU slots for multi-tenant serverless runtimes.
#
#   make demo      set up and run the demo (see README)
#   make test      every test: Go (host cgroup v1 + cgroup v2 VM) and Java
#   make bench     slot overhead, side by side per mode (host, then v2 VM)
#   make bench-lend  lending off and on: waiting invocations or chains beside CPU-bound ones (docs/lending.md)
#   make build     what ships: the agent, into bin/
#   make tools     the development tools (tools/: slotbench, ocitar) into bin/
#   make images    OCI image tarballs for the e2e cluster into bin/images/
#   make e2e       the end-to-end tests on real Kubernetes nodes, v1 and v2 (e2e/)

GO        ?= go
comma     := ,
GOFLAGS   ?=
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/cpuslot/cpuslot/internal/agent.Version=$(VERSION)
# go test through gotestsum: the same output, then the full output of every
# failed test again at the end, where a CI log's tail shows it.
GOTESTSUM ?= $(GO) run gotest.tools/gotestsum@v1.13.0

.PHONY: build tools test test-go test-java vm-deps tidy-check vet fuzz bench bench-host bench-vm bench-lend clean

# The product module (the repository root) holds what ships; test and
# development tooling lives in modules of its own beside it, each using the
# product through a replace directive: e2e/ (the end-to-end tests) and
# tools/ (benchmark, image packer).
MODULES := . e2e tools

build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/node-agent ./cmd/node-agent

tools:
	CGO_ENABLED=0 $(GO) build -C tools -o $(CURDIR)/bin/ ./slotbench ./ocitar

# The v2 tests boot a VM; CPUSLOT_REQUIRE_VM=1 makes them fail rather than
# skip when the VM cannot be prepared. The Go and the Java tests run side by
# side: the Go tests wait on the kernel, the VM and their clusters most of
# the time (their CPU was 40 % of two cores), and the Java tests use the
# rest. Both are written to pass on a loaded machine.
test: vm-deps tidy-check vet
	$(MAKE) --no-print-directory -j2 test-go test-java

vm-deps:
	bash hack/vm-deps.sh

# go.mod and go.sum of every module are exactly what go mod tidy makes.
tidy-check:
	set -e; for m in $(MODULES); do echo "go mod tidy -diff: $$m"; $(GO) -C $$m mod tidy -diff; done

vet:
	set -e; for m in $(MODULES); do $(GO) -C $$m vet ./...; done

# Kernel tests (cgrouptest.Kernel) run on the host's cgroup hierarchy here
# and again on cgroup v2 in the VM (test/vm). The e2e module's cluster tests
# skip without CPUSLOT_E2E=1 (make e2e).
test-go:
	set -e; for m in $(MODULES); do (cd $$m && CPUSLOT_REQUIRE_VM=1 $(GOTESTSUM) --format standard-quiet -- -p 1 -count=1 -timeout 30m ./...); done

test-java:
	cd runtime-image && CPUSLOT_REQUIRE_IT=1 ./build.sh verify

fuzz:
	$(GO) test ./api/slot/v1 -run '^$$' -fuzz FuzzDecode -fuzztime 60s

bench: bench-host bench-vm

bench-host: tools
	bin/slotbench

bench-vm: tools vm-deps
	bin/slotbench -vm -steady 500 -sporadic 60 -threads 1,2 -sporadic-threads 1,3 -share 4s

bench-lend: tools
	bin/slotbench -lend -rounds 3

clean:
	rm -rf bin

# --- e2e: a real single-node Kubernetes, see e2e/README.md -----------------
# Images are OCI image-layout tarballs (tools/ocitar) imported into the e2e
# cluster's containerd; no registry, no Docker engine. The names are the
# ones e2e/cluster and the tests use (e2e/cluster/images.go). Each image is
# an index, gzip layers, annotated with the source, revision and version and
# dated by the last commit (SOURCE_DATE_EPOCH: the same commit gives the same
# digest); the agent's has a manifest per IMAGE_ARCHES (pure Go,
# cross-compiled). Every image's NAME@DIGEST goes to bin/images/digests.txt,
# what a deployment pins (image.digest in the chart).
IMAGES_DIR       := bin/images
E2E_IMAGE_PREFIX ?= docker.io/cpuslot
IMAGE_ARCHES     ?= amd64,arm64
IMAGE_SOURCE     ?= https://github.com/cpuslot/cpuslot
export SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
OCI_ANNOTATIONS  := -annotation org.opencontainers.image.source=$(IMAGE_SOURCE) \
	-annotation org.opencontainers.image.revision=$(shell git rev-parse HEAD 2>/dev/null || echo unknown) \
	-annotation org.opencontainers.image.version=$(VERSION)

.PHONY: images images-go images-runtime e2e e2e-deps e2e-v2node

images: images-go images-runtime
	cat bin/cpuslot-runtime.digest >>$(IMAGES_DIR)/digests.txt
	cat $(IMAGES_DIR)/digests.txt

# The images built from Go (pause, probe, the agent): seconds. The v2 node
# needs only these to start (make e2e builds the runtime's beside it).
images-go: build
	mkdir -p $(IMAGES_DIR)
	CGO_ENABLED=0 $(GO) build -C tools -o $(CURDIR)/$(IMAGES_DIR)/ocitar ./ocitar
	CGO_ENABLED=0 $(GO) build -C e2e -trimpath -ldflags '-s -w' -o $(CURDIR)/$(IMAGES_DIR)/pause ./images/pause
	CGO_ENABLED=0 $(GO) build -C e2e -trimpath -ldflags '-s -w' -o $(CURDIR)/$(IMAGES_DIR)/probe ./images/probe
	set -e; for a in $(subst $(comma), ,$(IMAGE_ARCHES)); do \
		CGO_ENABLED=0 GOARCH=$$a $(GO) build -ldflags '$(LDFLAGS)' -o $(IMAGES_DIR)/linux-$$a/node-agent ./cmd/node-agent; done
	$(IMAGES_DIR)/ocitar -o $(IMAGES_DIR)/pause.tar -name $(E2E_IMAGE_PREFIX)/pause:e2e $(OCI_ANNOTATIONS) \
		-entrypoint /pause -add $(IMAGES_DIR)/pause:/pause >$(IMAGES_DIR)/digests.txt
	$(IMAGES_DIR)/ocitar -o $(IMAGES_DIR)/probe.tar -name $(E2E_IMAGE_PREFIX)/e2e-probe:e2e $(OCI_ANNOTATIONS) \
		-entrypoint /probe -add $(IMAGES_DIR)/probe:/probe >>$(IMAGES_DIR)/digests.txt
	$(IMAGES_DIR)/ocitar -o $(IMAGES_DIR)/node-agent.tar -name $(E2E_IMAGE_PREFIX)/node-agent:dev $(OCI_ANNOTATIONS) \
		-arch $(IMAGE_ARCHES) -entrypoint /node-agent -add '$(IMAGES_DIR)/linux-{arch}/node-agent:/node-agent' >>$(IMAGES_DIR)/digests.txt
	rm -rf $(IMAGES_DIR)/ocitar $(IMAGES_DIR)/pause $(IMAGES_DIR)/probe $(IMAGES_DIR)/linux-*

# The Java runtime images (make runtime-image), imported with the rest.
images-runtime: runtime-image
	mkdir -p $(IMAGES_DIR)
	ln -sf ../cpuslot-runtime.tar $(IMAGES_DIR)/cpuslot-runtime.tar

e2e-deps:
	bash hack/e2e-deps.sh
	bash hack/v2node-deps.sh
	bash hack/dashboard-view.sh

# Both node kinds at once (hack/e2e.sh): the legacy one on this machine
# (cgroup v1, cgroupfs; its packages one at a time, each brings up its
# cluster once) and, beside it, the current one in the VM (e2e/v2node:
# cgroup v2, systemd, containerd 2).
e2e: e2e-deps images-go
	GOTESTSUM='$(GOTESTSUM)' MAKE='$(MAKE)' bash hack/e2e.sh

# The current node alone.
e2e-v2node: images
	bash hack/v2node-deps.sh
	CPUSLOT_E2E=1 $(GO) -C e2e test ./v2node -count=1 -timeout 70m -v

# The end-to-end test against the real OpenWhisk (TestRealOpenWhisk): its
# standalone and wsk built from upstream checkouts by hack/openwhisk-build.sh
# (OPENWHISK_SRC, OPENWHISK_CLI_SRC, OPENWHISK_WSKDEPLOY_SRC; cached), so not
# part of make e2e (deploy/openwhisk/README.md). OPENWHISK_E2E_RUN: which tests
# it runs (go test -run), e.g. 'TestRealOpenWhisk|TestOpenWhiskActionPod' for the
# stand-in's test on the same cluster.
OPENWHISK_E2E_RUN ?= TestRealOpenWhisk
e2e-openwhisk: images
	s=$$(bash hack/openwhisk-build.sh standalone) && w=$$(bash hack/openwhisk-build.sh wsk) && \
	OPENWHISK_STANDALONE=$$s OPENWHISK_WSK=$$w CPUSLOT_E2E=1 \
	$(GO) -C e2e test -run '$(OPENWHISK_E2E_RUN)' -count=1 -timeout 40m -v .

# --- Helm chart and plain manifests (charts/cpuslot, deploy/) ----------------
# helm is built once from the Go module proxy and cached (hack/helm.sh).
#   make manifests   tools/manifests: regenerate deploy/cpuslot.yaml (helm template of the
#                    chart with default values, release/namespace cpuslot),
#                    charts/cpuslot/queries.txt (every PromQL query shipped),
#                    deploy/prometheus/cpuslot-rules.yml and
#                    deploy/openwhisk/action-pod.example.yaml
#   make dashboards  tools/dashboards: regenerate the chart's dashboards from their one
#                    definition (tools/dashboards/model.go): Grafana JSON in
#                    charts/cpuslot/dashboards/, Perses in charts/cpuslot/dashboards/perses/;
#                    then make manifests (queries.txt, deploy/cpuslot.yaml embed them)
#   make dashboard-view  tools/dashboards/view: Debian's Chromium, the page's npm packages
#                    (package-lock.json) and the page built (hack/dashboard-view.sh)
#   make dashboard-shots  docs/img/dashboard-{node,runtime}.png: both Perses dashboards
#                    drawn in headless Chromium against live data of this machine (root:
#                    agent, runtime, Prometheus, load; hack/dashboard-shots.sh), or against
#                    PROMETHEUS=<url> (SCRAPE_INTERVAL=<its scrape interval>, default 15s);
#                    SHOTS_OUT=<dir> writes elsewhere. Fails on a panel
#                    with an error, or without data where a serving node has some
#   make settings-doc  regenerate every file that lists the agent's settings from
#                    their one definition (settings.Keys, settings.AgentKeys; settings.Targets): the
#                    table of docs/settings.md, the chart's values.yaml, values.schema.json,
#                    config template and README rows, docs/agent.example.yaml and
#                    internal/agent/config_settings.go (TestGenerated checks them);
#                    then make manifests (deploy/cpuslot.yaml renders the chart)
#   make chart-test  helm lint --strict, helm template (defaults, all options),
#                    schema, queries, generated files up to date; the recipes
#                    in deploy/ (OPENWHISK_CHART=<openwhisk-deploy-kube>/helm/openwhisk
#                    also renders the real OpenWhisk chart through the post-renderer)
.PHONY: helm manifests dashboards dashboard-view dashboard-shots settings-doc chart-test

helm:
	@bash hack/helm.sh

manifests:
	$(GO) run -C tools ./manifests $(CURDIR)

dashboards:
	$(GO) run -C tools ./dashboards $(CURDIR)

dashboard-view:
	bash hack/dashboard-view.sh

SHOTS_OUT ?= $(CURDIR)/docs/img
# the scrape interval of PROMETHEUS (Perses's smallest query step)
SCRAPE_INTERVAL ?= 15s
dashboard-shots:
ifeq ($(PROMETHEUS),)
	SHOTS_OUT='$(SHOTS_OUT)' bash hack/dashboard-shots.sh
else
	bash hack/dashboard-view.sh
	cd tools/dashboards/view && node shots.mjs --prometheus '$(PROMETHEUS)' --out '$(SHOTS_OUT)' --scrape-interval '$(SCRAPE_INTERVAL)'
endif

settings-doc:
	$(GO) run ./internal/settings/gen $(CURDIR)
	$(MAKE) manifests

chart-test:
	$(GO) test ./charts/cpuslot ./deploy -count=1 -v
	$(GO) test -C tools ./dashboards -count=1 -v

# --- Java runtime (runtime-image/): demo, build, benchmark, OCI image -----------
#   make demo           the README's first command: agent + runtime + sample functions,
#                       quota shares and per-invocation overhead as tables (root)
#   make build-runtime  the runtime's jars (runtime-image/build.sh, tests skipped)
#   make bench-runtime  hello-world through the runtime, with slots vs without cgroups
#   make bench-guest    JavaScript and Python through the runtime against node and python3 (function-shaped workloads,
#                       memory per function)
#   make runtime-image  bin/cpuslot-runtime.tar, the JVM image as an OCI layout tarball, and
#                       bin/cpuslot-runtime-java.tar, the java kind's (no JavaScript or Python)
.PHONY: demo build-runtime bench-runtime bench-guest runtime-image

demo:
	bash hack/demo.sh

build-runtime:
	cd runtime-image && ./build.sh -q -DskipTests package

bench-runtime:
	bash hack/bench-runtime.sh

bench-guest:
	bash hack/bench-guest.sh $(BENCH_GUEST_ARGS)

# docker.io/cpuslot/runtime-jvm:dev and docker.io/cpuslot/runtime-java:dev; import with:
# ctr -n k8s.io images import bin/cpuslot-runtime.tar
runtime-image: build-runtime
	bash runtime-image/image/build-image.sh bin/cpuslot-runtime.tar docker.io/cpuslot/runtime-jvm:dev >bin/cpuslot-runtime.digest
	bash runtime-image/image/build-image.sh bin/cpuslot-runtime-java.tar docker.io/cpuslot/runtime-java:dev java >>bin/cpuslot-runtime.digest
	tar tf bin/cpuslot-runtime.tar
