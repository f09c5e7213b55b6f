package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/rialto-project/rialto/bench/internal/lab"
)

// accelLease is a lease's slots (or its gateway) and credential, from its
// rialto-accel:// URI.
type accelLease struct {
	addrs []string // slot addresses, or the gateway's
	cred  []byte
}

func parseAccelURI(s string) (accelLease, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "rialto-accel" || u.Host == "" {
		return accelLease{}, fmt.Errorf("lease URI is not an accelerator URI")
	}
	l := accelLease{addrs: []string{u.Host}, cred: []byte(strings.TrimPrefix(u.Path, "/"))}
	if s := u.Query().Get("slots"); s != "" {
		l.addrs = append(l.addrs, strings.Split(s, ",")...)
	}
	return l, nil
}

// cluster is what the benchmark leases from a `rialto agent`: one echo
// slot, three MCT slots (dedicated), and three shared leases of the MCT
// role served by the lender's batching gateway.
type cluster struct {
	lab      *lab.Cluster
	dir      string
	agentPID int
	echo     accelLease
	mct      accelLease
	gw       []accelLease
}

// startCluster runs a `rialto server` and a `rialto agent --accel 7` and
// makes the leases with `rialto lease create`; rules is the MCT rule set
// (JSON), passed with --role-config.
func startCluster(ctx context.Context, bin, work string, rules []byte) (*cluster, error) {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(work, "rialto-bench-accel.")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir}
	if c.lab, err = lab.Start(ctx, lab.Config{Bin: bin, Dir: filepath.Join(dir, "lab"), Progress: os.Stderr}); err != nil {
		c.close()
		return nil, err
	}
	ag, err := c.lab.StartAgent(ctx, lab.Agent{Name: "accel", Accel: 7, Args: []string{"--slot-memory", "1MiB"}})
	if err != nil {
		c.close()
		return nil, err
	}
	c.agentPID = ag.PID()
	rulesFile := filepath.Join(dir, "mct-rules.json")
	if err := os.WriteFile(rulesFile, rules, 0o600); err != nil {
		c.close()
		return nil, err
	}
	lease := func(args ...string) (accelLease, error) {
		l, err := c.lab.CreateLease(ctx, append([]string{"--kind", "accel", "--affinity", "accel"}, args...)...)
		if err != nil {
			return accelLease{}, err
		}
		return parseAccelURI(l.URI)
	}
	if c.echo, err = lease("--role", "echo"); err != nil {
		c.close()
		return nil, err
	}
	if c.mct, err = lease("--count", "3", "--role", "mct", "--role-config", rulesFile); err != nil {
		c.close()
		return nil, err
	}
	if len(c.mct.addrs) != 3 {
		c.close()
		return nil, fmt.Errorf("MCT lease has %d slots, want 3", len(c.mct.addrs))
	}
	// Each shared lease a whole slot (--share 1, where the binary has
	// shares), so that the gateway batches over three slots as before
	// shares: three default quarter shares would fall in one slot.
	shared := []string{"--mode", "shared"}
	if leaseCreateHas(bin, "share") {
		shared = append(shared, "--share", "1")
	}
	for range 3 {
		g, err := lease(append(shared, "--role", "mct", "--role-config", rulesFile)...)
		if err != nil {
			c.close()
			return nil, err
		}
		c.gw = append(c.gw, g)
	}
	return c, nil
}

func (c *cluster) close() {
	if c.lab != nil {
		_ = c.lab.Close()
	}
	os.RemoveAll(c.dir)
}
