// Code generated from internal/settings by `make settings-doc`. DO NOT EDIT.

package agent

// settingsSections are the file's sections of settings.Keys, in Config.
type settingsSections struct {
	Pool      PoolConfig      `json:"pool"`
	Admission AdmissionConfig `json:"admission"`
}

// PoolConfig is the file's pool section: one field per key of settings.Keys.
type PoolConfig struct {
	// slots kept ready per quota, e.g. 250m=8,500m=4,1=2 ("" = none)
	Prewarm string `json:"prewarm"`
	// pool mode: affinity, cache-lazy, cache-eager or uncached
	Mode string `json:"mode"`
	// how a slot limits CPU: cap, share or both
	Limit string `json:"limit"`
	// CFS period of every slot, 1ms..1s
	Period Duration `json:"period"`
	// slots per container, pre-warmed and grown
	MaxSlots int `json:"maxSlots"`
	// grown slots idle this long are removed
	IdleTimeout Duration `json:"idleTimeout"`
	// wait budget of a request that gives none
	DefaultWait Duration `json:"defaultWait"`
	// cap on any request's wait budget
	MaxWait Duration `json:"maxWait"`
	// largest quota a request may ask in a container without a CPU limit ("" = the node's CPUs)
	MaxQuota string `json:"maxQuota"`
	// distinct action names per container in metrics; later ones are counted as _other
	MaxActions int `json:"maxActions"`
}

func (s *PoolConfig) field(key string) any { return sectionField(s, "pool", key) }

// UnmarshalJSON reads the section through the settings' parser.
func (s *PoolConfig) UnmarshalJSON(b []byte) error { return decodeSection(b, "pool", s.field) }

// AdmissionConfig is the file's admission section: one field per key of settings.Keys.
type AdmissionConfig struct {
	// CPU budget per container ("" = the container's CPU limit, or unlimited when it has none)
	Budget string `json:"budget"`
	// budget multiplier, in (0, 100]
	Overcommit float64 `json:"overcommit"`
	// share of a sleeping lease's quota lent to new leases, in [0, 1] (0 = no lending)
	LendRatio float64 `json:"lendRatio"`
	// when a quota does not fit the budget: queue, degrade or reject
	Policy string `json:"policy"`
	// smallest quota a degraded grant gets
	MinDegraded string `json:"minDegraded"`
}

func (s *AdmissionConfig) field(key string) any { return sectionField(s, "admission", key) }

// UnmarshalJSON reads the section through the settings' parser.
func (s *AdmissionConfig) UnmarshalJSON(b []byte) error {
	return decodeSection(b, "admission", s.field)
}
