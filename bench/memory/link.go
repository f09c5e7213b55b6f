package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	memmap "github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/netns"
)

// A donor across a real link: memory-bench serve runs inside a network
// namespace joined to this one by a veth pair and a bridge (internal/netns,
// unshaped), so a fault's round trip crosses two network devices instead of
// loopback. The same read faults and floors as on loopback are measured
// against it, interleaved with them.

type link struct {
	lab   *netns.Lab
	donor *exec.Cmd
	cl    *client.Client
	floor string
	once  sync.Once
}

// startLink builds the lab and starts the donor in it, or says why not.
func startLink(ctx context.Context, c *cfg) (*link, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	lab, err := netns.New(ctx, netns.Config{Hosts: 1, Prefix: "rialto-membench"})
	if err != nil {
		return nil, err
	}
	l := &link{lab: lab}
	host := lab.Host(0).Addr.String()
	// A small region: memory another process holds makes this VM's page
	// allocations, hence UFFDIO_COPY, measurably slower.
	l.donor = lab.Command(ctx, 0, exe, "serve", "-addr", net.JoinHostPort(host, "0"),
		"-size", strconv.FormatInt(linkRegion, 10), "-pair")
	l.donor.Env = append(os.Environ(), "RIALTO_BENCH_CRED="+c.cred)
	// It ignores SIGINT (see serve): an interrupt must not take the donor
	// away under a mapping in use (run stops between parts).
	l.donor.Stderr = os.Stderr
	out, err := l.donor.StdoutPipe()
	if err != nil {
		l.close()
		return nil, err
	}
	if err := l.donor.Start(); err != nil {
		l.close()
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	addrs := strings.Fields(line)
	if err != nil || len(addrs) != 3 {
		l.close()
		return nil, fmt.Errorf("link donor: addresses %q: %v", line, err)
	}
	l.floor = addrs[2]
	if l.cl, err = client.Dial(ctx, addrs[0], c.cred, client.Options{Timeout: 30 * time.Second}); err != nil {
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
	}{{"loop", "", c.addrFloor, cl, c.donorPid}, {"link", "link ", l.floor, l.cl, l.donor.Process.Pid}} {
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
	if l.donor != nil && l.donor.Process != nil {
		_ = l.donor.Process.Kill()
		_ = l.donor.Wait()
	}
	if err := l.lab.Close(); err != nil {
		logf("link: %v", err)
	}
}
