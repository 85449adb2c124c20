package cluster

import "net"

// PKI is a cluster CA for other node kinds (e2e/v2node) to issue their
// components' certificates the way Up does.
type PKI struct{ p *pki }

// Cert describes one certificate; the files are <Name>.crt and <Name>.key.
type Cert struct {
	Name, CN       string
	Orgs, DNS      []string
	IPs            []net.IP
	Server, Client bool
}

// NewPKI makes a CA in dir (ca.crt, ca.key).
func NewPKI(dir string) (*PKI, error) {
	p, err := newPKI(dir)
	if err != nil {
		return nil, err
	}
	return &PKI{p: p}, nil
}

// Issue writes a certificate signed by the CA.
func (p *PKI) Issue(c Cert) error {
	return p.p.issue(certSpec{name: c.Name, cn: c.CN, orgs: c.Orgs, dns: c.DNS, ips: c.IPs, server: c.Server, client: c.Client})
}

// ServiceAccountKey writes sa.key and sa.pub, the service account token
// signing pair.
func (p *PKI) ServiceAccountKey() error { return p.p.serviceAccountKey() }

// Path is the path of a file of the PKI's directory (e.g. "ca.crt").
func (p *PKI) Path(name string) string { return p.p.path(name) }
