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
	"github.com/rialto-project/rialto/internal/rack"
)

// A donor across a real link: an emulated rack (internal/rack, unshaped)
// runs a `rialto server` and a `rialto agent` each in a network namespace
// joined to this one by a veth pair and a bridge, so a fault's round trip
// to the lease's donor crosses two network devices instead of loopback.
// The floor probe (memory-bench serve -floor-only) runs in the same
// namespace. The same read faults and floors as on
// loopback are measured against it, interleaved with them.

type link struct {
	rack    *rack.Rack
	cluster *lab.Cluster
	agent   int // its pid
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
	l := &link{}
	if l.dir, err = os.MkdirTemp(c.work, "rialto-bench-memlink."); err != nil {
		return nil, err
	}
	// A small region: memory another process holds makes this VM's page
	// allocations, hence UFFDIO_COPY, measurably slower.
	if l.rack, err = rack.Start(ctx, rack.Config{Binary: bin, StateDir: filepath.Join(l.dir, "rack"), Agents: 1,
		Memory: linkRegion, LogLevel: "warn", AgentArgs: lab.InsecureDataplaneArgs(bin)}); err != nil {
		l.close()
		return nil, err
	}
	node := l.rack.Agent(0)
	l.agent = l.rack.Pid(node)
	if l.cluster, err = lab.OnRack(l.rack, bin, filepath.Join(l.dir, "borrower"), os.Stderr); err != nil {
		l.close()
		return nil, err
	}
	size := fmt.Sprintf("%dMiB", linkRegion>>20)
	ls, err := l.cluster.CreateLease(ctx, "--kind", "memory", "--size", size, "--affinity", node.Name)
	if err != nil {
		l.close()
		return nil, err
	}
	addr, cred, err := memURI(ls.URI)
	if err != nil {
		l.close()
		return nil, err
	}
	l.floorP = l.rack.Command(ctx, node, exe, "serve", "-addr", net.JoinHostPort(node.Addr.String(), "0"), "-floor-only")
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
	}{{"loop", "", c.addrFloor, cl, c.donorPid}, {"link", "link ", l.floor, l.cl, l.agent}} {
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
	if l.rack != nil {
		if err := l.rack.Close(); err != nil {
			logf("link: %v", err)
		}
	}
	if l.dir != "" {
		os.RemoveAll(l.dir)
	}
}
