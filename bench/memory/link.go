package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/bench/internal/lab"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	memmap "github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/netns"
)

// A donor across a real link: a `rialto agent` runs inside a network
// namespace joined to this one by a veth pair and a bridge (internal/netns,
// unshaped), with a `rialto server` on the bridge's root-namespace address,
// so a fault's round trip to the lease's donor crosses two network devices
// instead of loopback. The floor probe (memory-bench serve -floor-only)
// runs in the same namespace. The same read faults and floors as on
// loopback are measured against it, interleaved with them.

type link struct {
	lab     *netns.Lab
	cluster *lab.Cluster
	agent   *lab.Proc
	floorP  *exec.Cmd
	cl      *client.Client
	floor   string
	dir     string
	once    sync.Once
}

// startLink builds the lab and starts the agent and the floor probe in
// it, or says why not.
func startLink(ctx context.Context, c *cfg) (*link, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	bin, err := filepath.Abs(c.bin)
	if err != nil {
		return nil, err
	}
	nl, err := netns.New(ctx, netns.Config{Hosts: 1, Prefix: "rialto-membench"})
	if err != nil {
		return nil, err
	}
	l := &link{lab: nl}
	if l.dir, err = os.MkdirTemp(c.work, "rialto-bench-memlink."); err != nil {
		l.close()
		return nil, err
	}
	if l.cluster, err = lab.Start(ctx, lab.Config{Bin: bin, Dir: l.dir, Net: nl, Progress: os.Stderr}); err != nil {
		l.close()
		return nil, err
	}
	// A small region: memory another process holds makes this VM's page
	// allocations, hence UFFDIO_COPY, measurably slower.
	size := fmt.Sprintf("%dMiB", linkRegion>>20)
	if l.agent, err = l.cluster.StartAgent(ctx, lab.Agent{Name: "linkdonor", Host: 0, Memory: size}); err != nil {
		l.close()
		return nil, err
	}
	ls, err := l.cluster.CreateLease(ctx, "--kind", "memory", "--size", size, "--affinity", "linkdonor")
	if err != nil {
		l.close()
		return nil, err
	}
	addr, cred, err := memURI(ls.URI)
	if err != nil {
		l.close()
		return nil, err
	}
	host := nl.Host(0).Addr.String()
	l.floorP = nl.Command(ctx, 0, exe, "serve", "-addr", net.JoinHostPort(host, "0"), "-floor-only")
	// It ignores SIGINT (see serve).
	l.floorP.Stderr = os.Stderr
	out, err := l.floorP.StdoutPipe()
	if err != nil {
		l.close()
		return nil, err
	}
	if err := l.floorP.Start(); err != nil {
		l.close()
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	addrs := strings.Fields(line)
	if err != nil || len(addrs) != 1 {
		l.close()
		return nil, fmt.Errorf("link floor probe: addresses %q: %v", line, err)
	}
	l.floor = addrs[0]
	if l.cl, err = client.Dial(ctx, addr, cred, client.Options{Timeout: 30 * time.Second}); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// linkRegion is the size of the link donor's region.
const linkRegion = 256 << 20

// measure runs one round of the link pass: read faults and floors against
// the loopback donor (cl, c.addrFloor), then the same across the link.
func (l *link) measure(ctx context.Context, cl *client.Client, c *cfg, res *results) {
	// The same cache for both, which the 20,000 faults do not fill: no
	// fault evicts.
	opts := memmap.Options{Spin: c.mapSpin, CacheBytes: linkRegion * 4 / 10}
	for _, w := range []struct {
		key, prefix, floor string
		cl                 *client.Client
		pid                int
	}{{"loop", "", c.addrFloor, cl, c.donorPid}, {"link", "link ", l.floor, l.cl, l.agent.PID()}} {
		mapReads(ctx, w.cl, w.key, opts, w.pid, res)
		if w.floor == "" {
			continue
		}
		lat, err := floorRTT(w.floor, 20000)
		if err != nil {
			fail(err)
		}
		res.add(w.prefix+"pass floor p50", pct(lat, 50))
		if lat, err = floorUDP(w.floor, 20000); err == nil {
			res.add(w.prefix+"pass udp floor p50", pct(lat, 50))
		}
	}
}

// close stops the donor and removes the lab, once.
func (l *link) close() { l.once.Do(l.stop) }

func (l *link) stop() {
	if l.cl != nil {
		_ = l.cl.Close()
	}
	if l.floorP != nil && l.floorP.Process != nil {
		_ = l.floorP.Process.Kill()
		_ = l.floorP.Wait()
	}
	if l.cluster != nil {
		if err := l.cluster.Close(); err != nil {
			logf("link: %v", err)
		}
	}
	if l.dir != "" {
		os.RemoveAll(l.dir)
	}
	if err := l.lab.Close(); err != nil {
		logf("link: %v", err)
	}
}
