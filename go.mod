module github.com/cpuslot/cpuslot

go 1.26
