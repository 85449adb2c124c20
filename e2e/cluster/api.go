package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

// apiClient is a minimal Kubernetes API client (standard library only, so
// the module does not depend on client-go for the harness).
type apiClient struct {
	base string
	hc   *http.Client
}

func newAPIClient(base string, p *pki) (*apiClient, error) {
	ca, err := os.ReadFile(p.path("ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(p.path("admin.crt"), p.path("admin.key"))
	if err != nil {
		return nil, err
	}
	return &apiClient{base: base, hc: &http.Client{
		Timeout: 15 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
		},
	}}, nil
}

func (a *apiClient) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return &apiError{Code: resp.StatusCode, Msg: fmt.Sprintf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

type apiError struct {
	Code int
	Msg  string
}

func (e *apiError) Error() string { return e.Msg }

func (a *apiClient) get(ctx context.Context, path string, out any) error {
	return a.do(ctx, "GET", path, nil, out)
}

type objectMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
}

type condition struct {
	Type   string `json:"type"`
	Status string `json:"status"`
	Reason string `json:"reason"`
	Msg    string `json:"message"`
}

func (c *Cluster) nodeReady(ctx context.Context) error {
	var node struct {
		Status struct {
			Conditions []condition `json:"conditions"`
		} `json:"status"`
	}
	if err := c.api.get(ctx, "/api/v1/nodes/"+c.nodeName, &node); err != nil {
		return err
	}
	for _, cd := range node.Status.Conditions {
		if cd.Type == "Ready" {
			if cd.Status == "True" {
				return nil
			}
			return fmt.Errorf("node %s Ready=%s: %s: %s", c.nodeName, cd.Status, cd.Reason, cd.Msg)
		}
	}
	return fmt.Errorf("node %s has no Ready condition yet", c.nodeName)
}

// NamespaceReady reports whether pods can be created in ns: the default
// service account and the kube-root-ca.crt config map exist (the
// controller-manager makes them shortly after the namespace).
func (c *Cluster) NamespaceReady(ctx context.Context, ns string) error {
	if err := c.api.get(ctx, "/api/v1/namespaces/"+ns+"/serviceaccounts/default", nil); err != nil {
		return err
	}
	return c.api.get(ctx, "/api/v1/namespaces/"+ns+"/configmaps/kube-root-ca.crt", nil)
}

// WaitNamespace waits until NamespaceReady.
func (c *Cluster) WaitNamespace(ctx context.Context, ns string, timeout time.Duration) error {
	return c.waitFor(ctx, nil, timeout, "namespace "+ns+" ready", func() error { return c.NamespaceReady(ctx, ns) })
}

type podList struct {
	Items []struct {
		Metadata objectMeta `json:"metadata"`
	} `json:"items"`
}

// deleteAllPods deletes every pod with a short grace period and waits
// until the kubelet has confirmed each deletion (which it does after it
// has torn the pod down).
func (c *Cluster) deleteAllPods(ctx context.Context) error {
	var pods podList
	if err := c.api.get(ctx, "/api/v1/pods", &pods); err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		return nil
	}
	c.logf("cluster: deleting %d pods", len(pods.Items))
	grace := int64(1)
	for _, p := range pods.Items {
		path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", url.PathEscape(p.Metadata.Namespace), url.PathEscape(p.Metadata.Name))
		body := map[string]any{"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace}
		if err := c.api.do(ctx, "DELETE", path, body, nil); err != nil {
			if ae, ok := err.(*apiError); !ok || ae.Code != 404 {
				return err
			}
		}
	}
	return c.waitFor(ctx, nil, time.Until(deadlineOf(ctx, 60*time.Second)), "pods deleted", func() error {
		var left podList
		if err := c.api.get(ctx, "/api/v1/pods", &left); err != nil {
			return err
		}
		if n := len(left.Items); n > 0 {
			return fmt.Errorf("%d pods left", n)
		}
		return nil
	})
}

func deadlineOf(ctx context.Context, def time.Duration) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(def)
}

func httpOK(u string) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	return nil
}
