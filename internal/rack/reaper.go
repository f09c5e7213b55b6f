package rack

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/internal/filelock"
	"github.com/rialto-project/rialto/internal/netns"
)

// reaperArg is the hidden first argument that makes the rialto binary a
// reaper: rialto rack-reaper STATEDIR.
const reaperArg = "rack-reaper"

// RunReaperIfChild makes this process a rack's reaper and exits if it was
// started as one (the hidden argument rack-reaper); otherwise it returns at
// once. The rialto binary calls it first thing in main, so that a Rack can
// start its reaper from the same binary as the processes it runs.
//
// The reaper reads its standard input, a pipe from the Rack's process:
// "lab ID" lines name labs to remove, "done" dismisses it. When the pipe
// closes without "done" (the Rack's process died) it purges the labs and
// clears them from the state dir's record. It ignores SIGINT, SIGTERM and
// SIGHUP, so that a terminal's signals do not stop it before it has
// cleaned up; the state dir's lock, inherited as file descriptor 3, is held
// until it exits.
func RunReaperIfChild() {
	if len(os.Args) != 3 || os.Args[1] != reaperArg {
		return
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "rack-reaper")
	os.Exit(reap(os.Stdin, os.Args[2], log))
}

func reap(in io.Reader, dir string, log *slog.Logger) int {
	var ids []string
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch f := strings.Fields(sc.Text()); {
		case len(f) == 2 && f[0] == "lab":
			ids = append(ids, f[1])
		case len(f) == 1 && f[0] == "done":
			return 0
		}
	}
	if len(ids) == 0 {
		return 0
	}
	log.Warn("the rack's process is gone without closing it: removing its lab", "labs", ids)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := 0
	for _, id := range ids {
		if err := netns.Purge(ctx, id, log); err != nil {
			log.Error("purge", "lab", id, "err", err)
			code = 1
			continue
		}
		if rec, err := readRecord(dir); err == nil && rec.Lab == id {
			rec.Lab, rec.PID, rec.Reaper = "", 0, 0
			if err := writeRecord(dir, rec); err != nil {
				log.Error("record", "err", err)
			}
		}
		log.Info("removed", "lab", id)
	}
	return code
}

// reaper is the Rack's side of its reaper process.
type reaper struct {
	cmd  *exec.Cmd
	in   *os.File // write end of the reaper's stdin; only this process has it
	done chan struct{}
}

func startReaper(bin, dir string, lock *os.File, env []string) (*reaper, error) {
	pr, pw, err := os.Pipe() // close-on-exec: no other child inherits pw
	if err != nil {
		return nil, fmt.Errorf("rack: reaper pipe: %w", err)
	}
	defer pr.Close()
	logf, err := os.OpenFile(filepath.Join(dir, "logs", "reaper.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		pw.Close()
		return nil, fmt.Errorf("rack: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, reaperArg, dir)
	cmd.Stdin, cmd.Stderr = pr, logf
	cmd.ExtraFiles = []*os.File{lock}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("rack: start reaper: %w", err)
	}
	rp := &reaper{cmd: cmd, in: pw, done: make(chan struct{})}
	go func() {
		defer close(rp.done)
		_ = cmd.Wait()
	}()
	return rp, nil
}

// watch tells the reaper to remove lab id if this process dies.
func (rp *reaper) watch(id string) error {
	if _, err := fmt.Fprintf(rp.in, "lab %s\n", id); err != nil {
		return fmt.Errorf("rack: reaper: %w", err)
	}
	return nil
}

// dismiss ends the reaper: with done, it leaves; without, it purges the
// labs it watches first (used when Close could not remove the lab itself).
// It waits for the reaper to exit.
func (rp *reaper) dismiss(done bool) error {
	if done {
		_, _ = io.WriteString(rp.in, "done\n")
	}
	rp.in.Close()
	select {
	case <-rp.done:
		return nil
	case <-time.After(3 * time.Minute):
		_ = rp.cmd.Process.Kill()
		<-rp.done
		return errors.New("rack: reaper did not exit; killed")
	}
}

// record is StateDir/rack.json: the lab in use (or left behind by a run that
// could not remove it) and who owns it.
type record struct {
	Lab    string `json:"lab,omitempty"`        // lab ID (netns.Config.ID)
	Subnet string `json:"subnet,omitempty"`     // its /24, asked for again next time
	PID    int    `json:"pid,omitempty"`        // the process running the rack
	Reaper int    `json:"reaper_pid,omitempty"` // its reaper
}

func readRecord(dir string) (record, error) {
	var rec record
	p := filepath.Join(dir, "rack.json")
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return rec, nil
	}
	if err != nil {
		return rec, fmt.Errorf("rack: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("rack: %s: %w", p, err)
	}
	return rec, nil
}

func writeRecord(dir string, rec record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(dir, "rack.json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("rack: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("rack: %w", err)
	}
	return nil
}

// lockStateDir takes the exclusive lock on dir/lock that `rialto up` also
// takes. If the holder is the reaper of a run whose process died, it waits
// (up to a minute) for the reaper to finish cleaning up; any other holder
// is an error at once.
func lockStateDir(ctx context.Context, dir string) (*os.File, error) {
	deadline := time.Now().Add(time.Minute)
	f, err := filelock.Wait(ctx, filepath.Join(dir, "lock"), 50*time.Millisecond, func() bool {
		rec, _ := readRecord(dir)
		orphanedReaper := rec.Reaper != 0 && isReaper(rec.Reaper) && (rec.PID == 0 || !alive(rec.PID))
		return orphanedReaper && time.Now().Before(deadline)
	})
	if errors.Is(err, filelock.ErrLocked) {
		// err, a *filelock.HeldError, names the holder when /proc/locks
		// tells it.
		return nil, fmt.Errorf("%w: state dir %s is in use by another rialto up: %w", ErrInUse, dir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("rack: lock %s: %w", dir, err)
	}
	return f, nil
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) STATE ...; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// isReaper reports whether pid is a live rack reaper.
func isReaper(pid int) bool {
	if !alive(pid) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	if len(b) == 0 {
		// Exiting: its memory is gone, its descriptors (the lock among
		// them) not yet.
		return true
	}
	args := strings.Split(string(b), "\x00")
	return len(args) >= 2 && args[1] == reaperArg
}
