// Package targets starts the NBD servers the block benchmarks compare:
// the peers (nbdkit's file plugin, nbd-server, qemu-nbd; and, as a
// reference row that never sets a goal, nbdkit's nbd plugin in front of its
// file plugin, the field's two-hop chain) and Rialto through
// leases of `rialto agent` processes (a dedicated lease, a shared
// partition lease, a composed lease and a dedicated lease both served by
// `rialto attach`), each on an image on tmpfs, bound to 127.0.0.1.
//
// A Target says which processes serve it, so that a benchmark can read their
// CPU time around every run. Targets are started by one goroutine; Stop
// functions must be called once, after the benchmark.
package targets

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/bench/internal/lab"
	"github.com/rialto-project/rialto/bench/internal/stats"
)

// Target is one NBD export under test.
type Target struct {
	Name   string // short name used in tables: nbdkit, qemu-nbd, nbd-server, dedicated, shared, composed, attach
	Served string // which processes serve it, for the fragment
	URI    string // NBD URI (may name a secret export)
	// File, for a lease served by `rialto attach --fuse`, is the file to
	// loop-mount (no NBD URI then).
	File   string
	Rialto bool // served through a lease (carries the goals)
	// Reference marks a peer shown for comparison only: it is never the
	// best peer a goal is measured against (nbdkit-proxy, two hops).
	Reference bool
	pids      func() []int
}

// CPU returns the CPU seconds the serving processes have used so far.
func (t *Target) CPU() float64 {
	var s float64
	for _, p := range t.pids() {
		s += stats.ProcCPU(p)
	}
	return s
}

// PIDs lists the serving processes.
func (t *Target) PIDs() []int { return t.pids() }

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitNBD polls with nbdinfo until uri answers the handshake.
func waitNBD(ctx context.Context, uri string, alive func() bool) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if exec.CommandContext(ctx, "nbdinfo", "--size", uri).Run() == nil {
			return nil
		}
		if alive != nil && !alive() {
			return errors.New("server exited")
		}
		if time.Now().After(deadline) {
			return errors.New("server did not answer in 20 s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Peers are the peer servers' commands, for the fragment (PORT, IMG and
// CONF stand for the generated values).
var Peers = map[string]string{
	"nbdkit":       "nbdkit -f -i 127.0.0.1 -p PORT file IMG",
	"nbdkit-proxy": "nbdkit -f -i 127.0.0.1 -p PORT2 file IMG; nbdkit -f -i 127.0.0.1 -p PORT nbd uri=nbd://127.0.0.1:PORT2/",
	"qemu-nbd":     "qemu-nbd -f raw -b 127.0.0.1 -p PORT -x '' -t -e 16 IMG",
	"nbd-server":   "nbd-server -C CONF -p PIDFILE   # [generic] listenaddr=127.0.0.1 port=PORT allowlist=false; [exp] exportname=IMG flush=true fua=true trim=true",
}

// StartPeer starts one peer serving img. stop ends it.
func StartPeer(ctx context.Context, name, dir, img string) (t *Target, stop func(), err error) {
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	p := strconv.Itoa(port)
	var cmd *exec.Cmd
	switch name {
	case "nbdkit":
		cmd = exec.Command("nbdkit", "-f", "-i", "127.0.0.1", "-p", p, "file", img)
	case "qemu-nbd":
		cmd = exec.Command("qemu-nbd", "-f", "raw", "-b", "127.0.0.1", "-p", p, "-x", "", "-t", "-e", "16", img)
	case "nbd-server":
		return startNBDServer(ctx, dir, img, p)
	case "nbdkit-proxy":
		return startNBDKitProxy(ctx, dir, img, p)
	default:
		return nil, nil, fmt.Errorf("unknown peer %q", name)
	}
	pid, stop, err := startProc(ctx, cmd, filepath.Join(dir, name+".log"), "nbd://127.0.0.1:"+p+"/")
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Target{Name: name, URI: "nbd://127.0.0.1:" + p + "/", Served: fmt.Sprintf("`%s` (%s)", name, version(name)),
		pids: func() []int { return []int{pid} }}, stop, nil
}

// startNBDKitProxy starts nbdkit's file plugin on img and, in front of it,
// nbdkit's nbd plugin on port: a request crosses two servers, as one
// through `rialto attach` does (a reference row, never a goal's peer).
func startNBDKitProxy(ctx context.Context, dir, img, port string) (*Target, func(), error) {
	back, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	b := strconv.Itoa(back)
	backURI := "nbd://127.0.0.1:" + b + "/"
	bpid, bstop, err := startProc(ctx, exec.Command("nbdkit", "-f", "-i", "127.0.0.1", "-p", b, "file", img),
		filepath.Join(dir, "nbdkit-proxy-back.log"), backURI)
	if err != nil {
		return nil, nil, fmt.Errorf("nbdkit-proxy: file plugin: %w", err)
	}
	uri := "nbd://127.0.0.1:" + port + "/"
	fpid, fstop, err := startProc(ctx, exec.Command("nbdkit", "-f", "-i", "127.0.0.1", "-p", port, "nbd", "uri="+backURI),
		filepath.Join(dir, "nbdkit-proxy.log"), uri)
	if err != nil {
		bstop()
		return nil, nil, fmt.Errorf("nbdkit-proxy: nbd plugin: %w", err)
	}
	return &Target{Name: "nbdkit-proxy", URI: uri, Reference: true,
			Served: fmt.Sprintf("`nbdkit nbd` (the nbd plugin) in front of `nbdkit file` (%s): two hops, as through `rialto attach`; CPU of both; a reference row, never the best peer of a goal", version("nbdkit")),
			pids:   func() []int { return []int{fpid, bpid} }},
		func() { fstop(); bstop() }, nil
}

// startProc starts cmd with its output in logPath and waits until uri
// answers; stop ends it (SIGTERM, then SIGKILL after 10 s).
func startProc(ctx context.Context, cmd *exec.Cmd, logPath, uri string) (pid int, stop func(), err error) {
	log, err := os.Create(logPath)
	if err != nil {
		return 0, nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return 0, nil, fmt.Errorf("start: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	alive := func() bool {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	if err := waitNBD(ctx, uri, alive); err != nil {
		stop()
		return 0, nil, fmt.Errorf("%w (log %s)", err, logPath)
	}
	return cmd.Process.Pid, stop, nil
}

// startNBDServer starts nbd-server, which daemonises and forks a process
// per connection: its pid file names the parent, whose descendants are
// counted by procCPU.
func startNBDServer(ctx context.Context, dir, img, port string) (*Target, func(), error) {
	conf := filepath.Join(dir, "nbd-server.conf")
	pidf := filepath.Join(dir, "nbd-server.pid")
	err := os.WriteFile(conf, []byte(fmt.Sprintf(`[generic]
listenaddr = 127.0.0.1
port = %s
allowlist = false
[exp]
exportname = %s
flush = true
fua = true
trim = true
`, port, img)), 0o600)
	if err != nil {
		return nil, nil, err
	}
	if out, err := exec.CommandContext(ctx, "nbd-server", "-C", conf, "-p", pidf).CombinedOutput(); err != nil {
		return nil, nil, fmt.Errorf("nbd-server: %w: %s", err, out)
	}
	var pid int
	for range 200 {
		if b, err := os.ReadFile(pidf); err == nil {
			if pid, _ = strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				break
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	if pid == 0 {
		return nil, nil, errors.New("nbd-server wrote no pid file")
	}
	stop := func() {
		syscall.Kill(pid, syscall.SIGTERM)
		for range 200 {
			if syscall.Kill(pid, 0) != nil {
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
		syscall.Kill(pid, syscall.SIGKILL)
	}
	uri := "nbd://127.0.0.1:" + port + "/exp"
	if err := waitNBD(ctx, uri, nil); err != nil {
		stop()
		return nil, nil, fmt.Errorf("nbd-server: %w", err)
	}
	return &Target{Name: "nbd-server", URI: uri, Served: fmt.Sprintf("`nbd-server` (%s; a process per connection, all counted)", version("nbd-server")),
		pids: func() []int { return []int{pid} }}, stop, nil
}

func version(name string) string {
	var out []byte
	switch name {
	case "nbdkit":
		out, _ = exec.Command("nbdkit", "--version").CombinedOutput()
	case "qemu-nbd":
		out, _ = exec.Command("qemu-nbd", "--version").CombinedOutput()
	case "nbd-server":
		out, _ = exec.Command("nbd-server", "-V").CombinedOutput()
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line)
}

// Rialto names the lease kinds StartRialto can set up.
var Rialto = []string{"dedicated", "shared", "composed", "attach", "composed-unix", "attach-unix", "attach-fuse", "composed-fuse"}

// Leases are the Rialto targets' processes and leases.
type Leases struct {
	Targets  map[string]*Target
	LeaseIDs map[string]string // target name → lease ID
	Attached map[string]*lab.Attachment
}

// StartRialto starts the agents and leases of the named Rialto targets in
// c, every lease sizeMiB MiB on images under dir (a tmpfs):
//
//   - dedicated: a dedicated lease of agent "ded" (--block disk0=ded.img:SIZE),
//     its URI used directly;
//   - shared: a shared partition lease of agent "shr", whose device is
//     twice the size: a first shared lease takes the first half, the measured
//     one the second (a partition at an offset);
//   - composed: a 3-way composed lease over agents "c1", "c2", "c3"
//     (SIZE/3 each), served by `rialto attach` on 127.0.0.1;
//   - attach: the dedicated lease again, served by `rialto attach`;
//   - composed-unix: another 3-way composed lease, over agents "u1", "u2",
//     "u3", served by `rialto attach --socket` on a Unix socket in dir (an
//     extra row: the goal rows stay on TCP 127.0.0.1);
//   - attach-unix: a dedicated lease of another agent, "du", served by
//     `rialto attach --socket` on a Unix socket in dir (an extra row; a
//     lease is attached once at a time, so not the "attach" target's);
//   - attach-fuse: a dedicated lease of agent "df" through `rialto attach
//     --fuse` (a file in a FUSE mount in dir, for file-system benchmarks);
//   - composed-fuse: a 3-way composed lease over agents "f1", "f2", "f3"
//     through `rialto attach --fuse`.
func StartRialto(ctx context.Context, c *lab.Cluster, dir string, sizeMiB int64, names []string) (*Leases, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	ls := &Leases{Targets: map[string]*Target{}, LeaseIDs: map[string]string{}, Attached: map[string]*lab.Attachment{}}
	size := fmt.Sprintf("%dMiB", sizeMiB)
	pid := func(p *lab.Proc) func() []int { return func() []int { return []int{p.PID()} } }
	if want["dedicated"] || want["attach"] {
		ag, err := c.StartAgent(ctx, lab.Agent{Name: "ded", Blocks: []string{"disk0=" + filepath.Join(dir, "ded.img") + ":" + size}})
		if err != nil {
			return nil, err
		}
		l, err := c.CreateLease(ctx, "--kind", "block", "--mode", "dedicated", "--size", size, "--affinity", "ded")
		if err != nil {
			return nil, err
		}
		if want["dedicated"] {
			ls.Targets["dedicated"] = &Target{Name: "dedicated", URI: l.URI, Rialto: true, pids: pid(ag),
				Served: "`rialto agent` \"ded\": its dedicated lease's URI, straight from the agent"}
			ls.LeaseIDs["dedicated"] = l.ID
		}
		if want["attach"] {
			// On loopback TCP, as the peers are served (rialto attach's
			// default is a Unix socket: the attach-unix row).
			at, err := c.Attach(ctx, l.ID, "--listen", "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			ls.Attached["attach"] = at
			ls.LeaseIDs["attach"] = l.ID
			ls.Targets["attach"] = &Target{Name: "attach", URI: at.URI, Rialto: true,
				pids:   func() []int { return []int{ag.PID(), at.PID()} },
				Served: "the same dedicated lease through `rialto attach` on 127.0.0.1 (agent \"ded\" + the attach process, CPU of both)"}
		}
	}
	// A dedicated lease of an agent of its own, attached with args.
	attached := func(name, agent string, args []string, served string) error {
		ag, err := c.StartAgent(ctx, lab.Agent{Name: agent, Blocks: []string{"disk0=" + filepath.Join(dir, agent+".img") + ":" + size}})
		if err != nil {
			return err
		}
		l, err := c.CreateLease(ctx, "--kind", "block", "--mode", "dedicated", "--size", size, "--affinity", agent)
		if err != nil {
			return err
		}
		at, err := c.Attach(ctx, l.ID, args...)
		if err != nil {
			return err
		}
		ls.Attached[name] = at
		ls.LeaseIDs[name] = l.ID
		ls.Targets[name] = &Target{Name: name, URI: at.URI, File: at.File, Rialto: true,
			pids: func() []int { return []int{ag.PID(), at.PID()} }, Served: served}
		return nil
	}
	if want["attach-unix"] {
		if err := attached("attach-unix", "du", []string{"--socket", filepath.Join(dir, "attach.sock")},
			"a dedicated lease of `rialto agent` \"du\" through `rialto attach --socket` on a Unix socket (agent + the attach process, CPU of both)"); err != nil {
			return nil, err
		}
	}
	if want["attach-fuse"] {
		mnt := filepath.Join(dir, "attach-fuse")
		if err := os.MkdirAll(mnt, 0o700); err != nil {
			return nil, err
		}
		if err := attached("attach-fuse", "df", []string{"--fuse", mnt},
			"a dedicated lease of `rialto agent` \"df\" through `rialto attach --fuse` (a file in a FUSE mount; agent + the attach process, CPU of both)"); err != nil {
			return nil, err
		}
	}
	if want["shared"] {
		ag, err := c.StartAgent(ctx, lab.Agent{Name: "shr", Blocks: []string{"disk0=" + filepath.Join(dir, "shr.img") + ":" + fmt.Sprintf("%dMiB", 2*sizeMiB)}})
		if err != nil {
			return nil, err
		}
		if _, err := c.CreateLease(ctx, "--kind", "block", "--mode", "shared", "--size", size, "--affinity", "shr"); err != nil {
			return nil, err
		}
		l, err := c.CreateLease(ctx, "--kind", "block", "--mode", "shared", "--size", size, "--affinity", "shr")
		if err != nil {
			return nil, err
		}
		off := int64(0)
		if len(l.Parts) == 1 {
			off = l.Parts[0].Offset
		}
		ls.Targets["shared"] = &Target{Name: "shared", URI: l.URI, Rialto: true, pids: pid(ag),
			Served: fmt.Sprintf("`rialto agent` \"shr\": a shared lease, a partition at offset %d MiB of a %d MiB device whose other half another shared lease holds", off>>20, 2*sizeMiB)}
		ls.LeaseIDs["shared"] = l.ID
	}
	for _, k := range []struct{ name, prefix string }{{"composed", "c"}, {"composed-unix", "u"}, {"composed-fuse", "f"}} {
		if !want[k.name] {
			continue
		}
		if sizeMiB%3 != 0 {
			return nil, fmt.Errorf("%s: size %d MiB is not a multiple of 3", k.name, sizeMiB)
		}
		var ags []*lab.Proc
		for i := 1; i <= 3; i++ {
			ag, err := c.StartAgent(ctx, lab.Agent{Name: fmt.Sprintf("%s%d", k.prefix, i), Labels: []string{"pool=" + k.name},
				Blocks: []string{"disk0=" + filepath.Join(dir, fmt.Sprintf("%s%d.img", k.prefix, i)) + ":" + fmt.Sprintf("%dMiB", sizeMiB/3)}})
			if err != nil {
				return nil, err
			}
			ags = append(ags, ag)
		}
		l, err := c.CreateLease(ctx, "--kind", "block", "--mode", "composed", "--count", "3", "--size", size, "--label", "pool="+k.name)
		if err != nil {
			return nil, err
		}
		// On loopback TCP, as the peers are served, unless the row says
		// otherwise (rialto attach's default is a Unix socket).
		args := []string{"--listen", "127.0.0.1:0"}
		where := "on 127.0.0.1"
		switch k.name {
		case "composed-unix":
			args = []string{"--socket", filepath.Join(dir, "composed.sock")}
			where = "on a Unix socket"
		case "composed-fuse":
			mnt := filepath.Join(dir, "composed-fuse")
			if err := os.MkdirAll(mnt, 0o700); err != nil {
				return nil, err
			}
			args = []string{"--fuse", mnt}
			where = "--fuse (a file in a FUSE mount)"
		}
		at, err := c.Attach(ctx, l.ID, args...)
		if err != nil {
			return nil, err
		}
		ls.Attached[k.name] = at
		ls.LeaseIDs[k.name] = l.ID
		ls.Targets[k.name] = &Target{Name: k.name, URI: at.URI, File: at.File, Rialto: true,
			pids: func() []int {
				return []int{ags[0].PID(), ags[1].PID(), ags[2].PID(), at.PID()}
			},
			Served: fmt.Sprintf("a 3-way composed lease over `rialto agent`s \"%s1\", \"%s2\", \"%s3\" (one part each), through `rialto attach` %s (CPU of the three agents and the attach process)", k.prefix, k.prefix, k.prefix, where)}
	}
	return ls, nil
}
