module github.com/cpuslot/cpuslot

go 1.26.0

require (
	github.com/moby/sys/mountinfo v0.7.3
	github.com/opencontainers/cgroups v0.1.0
	golang.org/x/sys v0.49.0
)

require (
	github.com/coreos/go-systemd/v22 v22.6.0 // indirect
	github.com/cyphar/filepath-securejoin v0.4.1 // indirect
	github.com/godbus/dbus/v5 v5.1.0 // indirect
	github.com/moby/sys/userns v0.1.0 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
)
