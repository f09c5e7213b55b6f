package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/internal/childenv"
)

// Timeouts of a VM's life.
const (
	// StartTimeout bounds qemu's start until its QMP socket answers.
	StartTimeout = 30 * time.Second
	// StopTimeout bounds a clean stop (pause, flush, quit) before qemu is
	// killed.
	StopTimeout = 60 * time.Second
)

// ErrExited is a guest whose qemu exited on its own (the guest powered
// off, or qemu failed); the error says how.
var ErrExited = errors.New("vm: qemu exited")

// Running is what Run reports once the guest runs.
type Running struct {
	PID   int    // qemu's
	Accel string // the accelerator it runs under
}

// Run boots c's guest and supervises it: it starts qemu paused, adds the
// disk over QMP (blockdev-add of qemu's NBD client, then a virtio-blk
// device), resumes the guest and calls ready. It returns when ctx ends,
// after stopping the guest cleanly (Stop: the vCPUs pause and qemu drains
// and flushes the disk to its lender, then quits; killed after
// StopTimeout), or when qemu exits on its own (ErrExited, nil if the guest
// powered off with qemu's status 0). The console goes to Dir/console.log;
// qemu's own messages to log, with the disk's export name redacted.
func Run(ctx context.Context, c Config, log *slog.Logger, ready func(Running)) error {
	if err := c.check(); err != nil {
		return err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	qemu := c.QEMU
	if qemu == "" {
		var err error
		if qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return fmt.Errorf("%w: qemu-system-x86_64 not found (install qemu-system-x86)", ErrConfig)
		}
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	sock := filepath.Join(c.Dir, QMPSocket)
	_ = os.Remove(sock)
	redact := redactor(c.Disk.Export)

	p, err := startProcess(qemu, c.Args())
	if err != nil {
		return fmt.Errorf("vm: start qemu: %w", err)
	}
	// From here on, qemu is stopped (or found dead) before Run returns.
	q, err := p.dialQMP(ctx, sock, redact)
	if err == nil {
		err = c.attachDisk(ctx, q)
	}
	if err == nil {
		_, err = q.Execute(ctx, "cont", nil)
	}
	if err != nil {
		if q != nil {
			_ = q.Close()
		}
		p.kill()
		return fmt.Errorf("vm %s: %w%s", c.Name, err, p.tail(redact))
	}
	log.Info("vm: running", "name", c.Name, "pid", p.cmd.Process.Pid, "accel", c.Accel, "disk", c.Disk.Network+":"+c.Disk.Address)
	if ready != nil {
		ready(Running{PID: p.cmd.Process.Pid, Accel: c.Accel})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case ev := <-q.Events():
				log.Info("vm: qemu event", "name", c.Name, "event", ev.Name, "data", redact(string(ev.Data)))
			case <-q.Done():
				return
			}
		}
	}()
	defer wg.Wait()
	defer q.Close()
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("%w: %v%s", ErrExited, p.err, p.tail(redact))
		}
		log.Info("vm: guest powered off", "name", c.Name)
		return nil
	case <-ctx.Done():
	}
	log.Info("vm: stopping", "name", c.Name)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopTimeout)
	defer cancel()
	if err := stopQMP(sctx, q); err != nil {
		log.Warn("vm: clean stop failed; killing qemu", "name", c.Name, "err", err)
		p.kill()
		return fmt.Errorf("vm %s: clean stop: %w", c.Name, err)
	}
	select {
	case <-p.done:
	case <-sctx.Done():
		p.kill()
		return fmt.Errorf("vm %s: qemu did not quit within %v; killed", c.Name, StopTimeout)
	}
	log.Info("vm: stopped", "name", c.Name)
	return nil
}

// attachDisk adds the disk to the paused guest: qemu's NBD client as block
// node disk0, and a virtio-blk device on it.
func (c *Config) attachDisk(ctx context.Context, q *QMP) error {
	if _, err := q.Execute(ctx, "blockdev-add", c.blockdev()); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	if _, err := q.Execute(ctx, "device_add", map[string]any{"driver": "virtio-blk-pci", "drive": "disk0", "id": "vda"}); err != nil {
		return fmt.Errorf("disk device: %w", err)
	}
	return nil
}

// stopQMP stops a guest cleanly: "stop" pauses the vCPUs, and qemu drains
// and flushes every disk before answering (for an NBD disk, NBD_CMD_FLUSH
// to the lender); "quit" then ends qemu.
func stopQMP(ctx context.Context, q *QMP) error {
	if _, err := q.Execute(ctx, "stop", nil); err != nil {
		return err
	}
	if _, err := q.Execute(ctx, "quit", nil); err != nil {
		// qemu may close the socket before its answer reaches us.
		select {
		case <-q.Done():
			return nil
		default:
			return err
		}
	}
	return nil
}

// StopQMP stops the guest whose QMP socket is at path cleanly, as Run
// does on cancellation, for when the process that ran it is gone.
func StopQMP(ctx context.Context, path string) error {
	q, err := DialQMP(ctx, path, nil)
	if err != nil {
		return err
	}
	defer q.Close()
	return stopQMP(ctx, q)
}

// process is qemu, started and waited for by one goroutine locked to its
// OS thread, so that the parent-death signal (SIGTERM: qemu then shuts
// down, flushing its disks) fires only when the supervisor dies.
type process struct {
	cmd    *exec.Cmd
	done   chan struct{}
	err    error // from Wait, valid after done
	stderr *capBuffer
}

func startProcess(bin string, args []string) (*process, error) {
	p := &process{cmd: exec.Command(bin, args...), done: make(chan struct{}), stderr: &capBuffer{max: 8 << 10}}
	p.cmd.Stdout, p.cmd.Stderr = p.stderr, p.stderr
	// qemu needs none of Rialto's settings (the API token among them).
	p.cmd.Env = childenv.Environ()
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with qemu's wait
		if err := p.cmd.Start(); err != nil {
			started <- err
			close(p.done)
			return
		}
		started <- nil
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// dialQMP waits for qemu's QMP socket and connects.
func (p *process) dialQMP(ctx context.Context, sock string, redact func(string) string) (*QMP, error) {
	deadline := time.Now().Add(StartTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		q, err := DialQMP(dctx, sock, redact)
		cancel()
		if err == nil {
			return q, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("qemu exited at start: %v", p.err)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("qemu's QMP socket did not answer within %v: %w", StartTimeout, err)
		}
	}
}

// kill kills qemu and waits for it.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// tail is qemu's last output, redacted, for an error message.
func (p *process) tail(redact func(string) string) string {
	s := strings.TrimSpace(p.stderr.String())
	if s == "" {
		return ""
	}
	return "; qemu said: " + redact(s)
}

// capBuffer keeps the last max bytes written to it.
type capBuffer struct {
	mu  sync.Mutex
	b   bytes.Buffer
	max int
}

func (c *capBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b.Write(p)
	if c.b.Len() > c.max {
		c.b.Next(c.b.Len() - c.max)
	}
	return len(p), nil
}

func (c *capBuffer) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}
