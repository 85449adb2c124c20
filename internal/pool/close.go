package pool

import (
	"errors"
	"fmt"
	"os"

	"github.com/cpuslot/cpuslot/internal/cgroup"
)

// Close stops the pool. With remove, every slot is removed (threads moved
// back to the container) and the container's preparation undone: the
// container is gone or no longer served. Without, the slots stay for the
// next agent to adopt and running invocations keep their fds.
//
// Close first waits for cgroup I/O in progress (a slot being created would
// otherwise be left behind). Fds are never closed under a grant: a grant
// owns the fds opened for it.
func (p *Pool) Close(remove bool) error {
	p.mu.Lock()
	p.closed = true
	p.broadcast()
	for p.io > 0 {
		p.ioDone.Wait()
	}
	slots := make([]*slot, 0, len(p.slots))
	for _, s := range p.slots {
		if s.io != nil {
			slots = append(slots, s)
		}
	}
	p.slots = map[uint32]*slot{}
	p.leases = map[uint64]*lease{}
	p.threadLeases = map[ownerThread]*lease{}
	p.holdCount = map[Owner]int{}
	p.credits = map[Owner]*credit{}
	p.mu.Unlock()
	// Nothing counts for the container any more (settle checks closed).
	p.metrics.ForgetContainer(p.name)
	var errs []error
	var left []*slot
	for _, s := range slots {
		if remove {
			if err := s.io.Remove(); err != nil {
				errs = append(errs, err)
				if errors.Is(err, cgroup.ErrBusy) {
					left = append(left, s)
				}
			}
		} else {
			s.io.Close()
		}
	}
	if len(left) > 0 && !p.stale.Load() {
		// Removed later (RemoveLeft), once the container's threads are
		// gone; the backend stays open until then.
		p.mu.Lock()
		p.left = left
		p.mu.Unlock()
		return errors.Join(errs...)
	}
	if remove && len(errs) == 0 {
		if err := p.backend.Unprepare(); err != nil {
			errs = append(errs, err)
		}
	}
	p.backend.Close()
	if p.stale.Load() {
		// The container's cgroup is gone, and its slots with it.
		for _, err := range errs {
			if !errors.Is(err, cgroup.ErrGone) {
				return errors.Join(errs...)
			}
		}
		return nil
	}
	return errors.Join(errs...)
}

// RemoveLeft tries again to remove the slots Close(true) left behind
// (ErrBusy: threads kept arriving), then undoes the container's
// preparation and releases the backend. done is false while a slot still
// has threads arriving; once done, err says what failed, if anything (a
// slot already gone counts as removed). With last, slots still busy are
// given up: their descriptors and the backend's are closed.
func (p *Pool) RemoveLeft(last bool) (done bool, err error) {
	p.mu.Lock()
	left := p.left
	p.mu.Unlock()
	if len(left) == 0 {
		return true, nil // nothing left, the backend already released
	}
	var still []*slot
	var errs, busy []error
	for _, s := range left {
		if err := s.io.Remove(); err != nil {
			if errors.Is(err, cgroup.ErrBusy) {
				still = append(still, s)
				busy = append(busy, err) // says why: threads, or a child cgroup
			} else if !errors.Is(err, cgroup.ErrGone) && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if len(still) > 0 && !last {
		p.mu.Lock()
		p.left = still
		p.mu.Unlock()
		return false, fmt.Errorf("%d slot(s) not removed yet: %w", len(still), errors.Join(busy...))
	}
	p.mu.Lock()
	p.left = nil
	p.mu.Unlock()
	if len(still) > 0 {
		// Given up: release what they hold open, so that a container that
		// keeps entering them leaks no descriptor.
		for _, s := range still {
			s.io.Close()
		}
		errs = append(errs, fmt.Errorf("%d slot(s) given up: %w", len(still), errors.Join(busy...)))
	} else if len(errs) == 0 {
		if err := p.backend.Unprepare(); err != nil && !errors.Is(err, cgroup.ErrGone) && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	p.backend.Close()
	return true, errors.Join(errs...)
}
