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
	// Since the pool started: Wakes counts the sleeping leases woken, Lends
	// the sleeps that lent quota, GiveBacks the lent quotas that ended (a
	// wake or the sleeper's release; Lends - GiveBacks leases lend now),
	// Cuts the awake leases lowered to give a waking lease its quota back.
	Wakes     uint64        `json:"wakes"`
	Lends     uint64        `json:"lends"`
	GiveBacks uint64        `json:"giveBacks"`
	Cuts      uint64        `json:"cuts"`
	Quotas    []QuotaStatus `json:"quotas"`
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
		Leases: len(p.leases), Degraded: len(p.degraded), LentMilli: p.lent, Wakes: p.wakes,
		Lends: p.lends, GiveBacks: p.givebacks, Cuts: p.cuts}
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
