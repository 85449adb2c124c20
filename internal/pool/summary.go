package pool

// Summary describes the pool per quota, for HELLO and /debug/pools.
type Summary struct {
	Name        string `json:"name"`
	Mode        Mode   `json:"mode"`
	BudgetMilli uint32 `json:"budgetMilli"`
	UsedMilli   uint32 `json:"usedMilli"`
	Leases      int    `json:"leases"`
	Degraded    int    `json:"degraded"`
	// LentMilli is the quota sleeping leases lend now (not in UsedMilli).
	LentMilli uint32 `json:"lentMilli"`
	// Wakes counts the sleeping leases woken since the pool started.
	Wakes  uint64        `json:"wakes"`
	Quotas []QuotaStatus `json:"quotas"`
}

// QuotaStatus counts the slots of one quota.
type QuotaStatus struct {
	QuotaMilli uint32 `json:"quotaMilli"`
	PeriodUS   uint32 `json:"periodUS"`
	Slots      int    `json:"slots"`
	Free       int    `json:"free"`
	Leased     int    `json:"leased"`
	Prewarm    int    `json:"prewarm"`
}

// Summary reports the pool's state.
func (p *Pool) Summary() Summary {
	p.mu.Lock()
	defer p.mu.Unlock()
	byQ := map[uint32]*QuotaStatus{}
	get := func(q uint32) *QuotaStatus {
		if byQ[q] == nil {
			byQ[q] = &QuotaStatus{QuotaMilli: q, PeriodUS: p.cfg.PeriodUS, Prewarm: p.cfg.Prewarm[q]}
		}
		return byQ[q]
	}
	for q := range p.cfg.Prewarm {
		get(q)
	}
	for _, s := range p.slots {
		st := get(s.spec.QuotaMilli)
		st.Slots++
		switch {
		case s.lease != nil:
			st.Leased++
		case !s.busy:
			st.Free++
		}
	}
	sum := Summary{Name: p.name, Mode: p.cfg.Mode, BudgetMilli: p.budget.Limit, UsedMilli: p.budget.Used(),
		Leases: len(p.leases), Degraded: len(p.degraded), LentMilli: p.lent, Wakes: p.wakes}
	for _, st := range byQ {
		sum.Quotas = append(sum.Quotas, *st)
	}
	sortQuotas(sum.Quotas)
	return sum
}

func sortQuotas(q []QuotaStatus) {
	for i := 1; i < len(q); i++ {
		for j := i; j > 0 && q[j].QuotaMilli < q[j-1].QuotaMilli; j-- {
			q[j], q[j-1] = q[j-1], q[j]
		}
	}
}
