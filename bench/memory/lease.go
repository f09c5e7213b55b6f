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

// startCluster runs a `rialto server` and a `rialto agent` lending memory,
// makes a memory lease of the bulk size with `rialto lease create`, and
// points c at it: the donor every Rialto figure is measured against is the
// product's, reached with the lease's URI.
func startCluster(ctx context.Context, c *cfg) (*lab.Cluster, error) {
	bin, err := filepath.Abs(c.bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(c.work, "rialto-bench-memory.")
	if err != nil {
		return nil, err
	}
	atExit(func() { os.RemoveAll(dir) })
	cl, err := lab.Start(ctx, lab.Config{Bin: bin, Dir: dir, Progress: os.Stderr})
	if err != nil {
		return nil, err
	}
	size := fmt.Sprintf("%dMiB", c.bulkBytes>>20)
	ag, err := cl.StartAgent(ctx, lab.Agent{Name: "donor", Memory: size})
	if err != nil {
		cl.Close()
		return nil, err
	}
	l, err := cl.CreateLease(ctx, "--kind", "memory", "--size", size, "--affinity", "donor")
	if err != nil {
		cl.Close()
		return nil, err
	}
	if c.addr, c.cred, err = memURI(l.URI); err != nil {
		cl.Close()
		return nil, err
	}
	c.donorPid = ag.PID()
	c.donorDesc = fmt.Sprintf("a `rialto agent` process lending %s of memory (`--memory %s`), through a memory lease made by `rialto lease create`", size, size)
	c.commands = cl.Commands
	return cl, nil
}

// memURI splits rialto-mem://HOST:PORT/CREDENTIAL.
func memURI(s string) (addr, cred string, err error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "rialto-mem" || u.Host == "" {
		return "", "", fmt.Errorf("lease URI is not a memory URI")
	}
	cred = strings.TrimPrefix(u.Path, "/")
	if cred == "" {
		return "", "", fmt.Errorf("memory URI without a credential")
	}
	return u.Host, cred, nil
}
