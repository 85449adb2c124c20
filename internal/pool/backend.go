package pool

import "github.com/cpuslot/cpuslot/internal/cgroup"

// CgroupBackend serves a pool from a real container cgroup.
func CgroupBackend(c *cgroup.Container) Backend { return cgroupBackend{c} }

type cgroupBackend struct{ c *cgroup.Container }

func (b cgroupBackend) CreateSlot(id uint32, spec cgroup.Spec) (SlotIO, error) {
	s, err := b.c.CreateSlot(id, spec)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (b cgroupBackend) AdoptSlots() (map[uint32]SlotIO, error) {
	slots, err := b.c.AdoptSlots()
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]SlotIO, len(slots))
	for _, s := range slots {
		out[s.ID] = s
	}
	return out, nil
}

func (b cgroupBackend) MoveOut(tid int) error       { return b.c.MoveOut(tid) }
func (b cgroupBackend) LimitMilli() (uint32, error) { return b.c.LimitMilli() }
func (b cgroupBackend) Unprepare() error            { return b.c.Unprepare() }
func (b cgroupBackend) Close()                      { b.c.Close() }

// SlotIO is one slot's cgroup (cgroup.Slot in production).
type SlotIO interface {
	// OpenFDs opens the fds a client gets: placement fds, then counter
	// fds. The caller closes them.
	OpenFDs() ([]int, error)
	Spec() cgroup.Spec
	Place(tid int) error
	Retune(cgroup.Spec) error
	Usage() (cgroup.Usage, error)
	Remove() error
	Close()
}

// Backend is a container's cgroup (cgroup.Container in production).
type Backend interface {
	CreateSlot(id uint32, spec cgroup.Spec) (SlotIO, error)
	AdoptSlots() (map[uint32]SlotIO, error)
	// MoveOut moves a thread out of its slot, back to the container.
	MoveOut(tid int) error
	LimitMilli() (uint32, error)
	// Unprepare undoes what preparing the container changed, once no
	// slot is left.
	Unprepare() error
	// Close releases what the backend holds open (the container's
	// directory fds).
	Close()
}
