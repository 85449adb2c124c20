module github.com/cpuslot/cpuslot/e2e

go 1.26.6

require (
	github.com/cpuslot/cpuslot v0.0.0
	golang.org/x/sys v0.49.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/cyphar/filepath-securejoin v0.7.0 // indirect
	github.com/godbus/dbus/v5 v5.1.0 // indirect
	github.com/moby/sys/mountinfo v0.7.3 // indirect
	github.com/moby/sys/userns v0.2.1 // indirect
	github.com/opencontainers/cgroups v0.1.0 // indirect
	github.com/sirupsen/logrus v1.10.2 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
)

replace github.com/cpuslot/cpuslot => ../
