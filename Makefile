# cpuslot: per-invocation CPU slots for multi-tenant serverless runtimes.
#
#   make demo      set up and run the demo (see README)
#   make test      every test: Go (host cgroup v1 + cgroup v2 VM) and Java
#   make bench     slot overhead, side by side per mode (host, then v2 VM)
#   make build     the agent and tools into bin/

GO        ?= go
GOFLAGS   ?=
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/cpuslot/cpuslot/internal/agent.Version=$(VERSION)

.PHONY: build test test-go test-java vm-deps vet fuzz bench bench-host bench-vm clean

build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/node-agent ./cmd/node-agent
	CGO_ENABLED=0 $(GO) build -o bin/slotbench ./cmd/slotbench

# The v2 tests boot a VM; CPUSLOT_REQUIRE_VM=1 makes them fail rather than
# skip when the VM cannot be prepared.
test: vm-deps vet test-go test-java

vm-deps:
	bash hack/vm-deps.sh

vet:
	$(GO) vet ./...

test-go:
	CPUSLOT_REQUIRE_VM=1 $(GO) test -count=1 -timeout 20m ./...

test-java:
	cd runtime-image && ./build.sh verify

fuzz:
	$(GO) test ./api/slot/v1 -run '^$$' -fuzz FuzzDecode -fuzztime 60s

bench: bench-host bench-vm

bench-host: build
	bin/slotbench

bench-vm: build vm-deps
	bin/slotbench -vm -steady 500 -sporadic 60 -threads 1,2 -share 4s

clean:
	rm -rf bin
