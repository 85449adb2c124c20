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
