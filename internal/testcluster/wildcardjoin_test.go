package testcluster

import (
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestJoinRefusesWildcardHosts: a node's certificate names its own hosts
// (its address, agent URL and endpoints), which its join declares. A
// join declaring a wildcard (*.example.com) is refused: its certificate
// would be good for every host of the domain — every other lender's
// address and the control plane's — and its holder could pose as any of
// them to borrowers, agents and API clients (which check the cluster CA
// and the host name). It was issued.
func TestJoinRefusesWildcardHosts(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	ctx := ctxT(t)
	boot := api.NewClient(c.URL, BootstrapToken, c.HTTPClient())
	for _, tc := range []struct {
		name string
		req  api.JoinRequest
	}{
		{"address", api.JoinRequest{Address: "*.example.com", AgentURL: "https://node.example.com:7071"}},
		{"agent URL", api.JoinRequest{Address: "node.example.com", AgentURL: "https://*.example.com:7071"}},
		{"endpoint", api.JoinRequest{Address: "node.example.com", AgentURL: "https://node.example.com:7071",
			Endpoints: map[api.Kind]string{api.KindBlock: "*.example.com:10809"}}},
	} {
		req := tc.req
		req.Name, req.Fingerprint = "rogue-"+tc.name, api.Fingerprint{MachineID: "rogue-" + tc.name}
		req.Devices = []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 20}}
		hosts := []string{"*.example.com"}
		if tc.name != "address" {
			hosts = append(hosts, "node.example.com")
		}
		csr, _, err := pki.NewCSR("", hosts)
		if err != nil {
			t.Fatal(err)
		}
		req.CSR = string(csr)
		jr, err := boot.Join(ctx, req)
		if err == nil {
			blk, _ := pem.Decode([]byte(jr.Certificate))
			cert, perr := x509.ParseCertificate(blk.Bytes)
			good := perr == nil && cert.VerifyHostname("controlplane.example.com") == nil
			t.Errorf("%s: a join declaring *.example.com got a node certificate (%v): good for controlplane.example.com: %v", tc.name, perr, good)
			continue
		}
		if !api.IsCode(err, api.CodeInvalid) {
			t.Errorf("%s: want 400 invalid_request, got %v", tc.name, err)
		}
	}
}
