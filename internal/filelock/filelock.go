package filelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrLocked is the error (wrapped in a *HeldError by Open and Wait) of a
// lock another open file description holds.
var ErrLocked = errors.New("locked by another process")

// HeldError is Open's and Wait's error for a lock held by another: the
// file and, when /proc/locks tells it, the holder.
type HeldError struct {
	Path   string
	PID    int  // 0: unknown
	Shared bool // the holder's lock is shared (LOCK_SH)
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is %v%s", e.Path, ErrLocked, HolderNote(e.PID))
}

func (e *HeldError) Unwrap() error { return ErrLocked }

// TryLock takes an exclusive flock on f without waiting: an error
// wrapping ErrLocked (and unix.EWOULDBLOCK) if another open file
// description holds one.
func TryLock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EWOULDBLOCK):
			return fmt.Errorf("%w: %w", ErrLocked, err)
		}
		return fmt.Errorf("filelock: flock %s: %w", f.Name(), err)
	}
}

// Unlock lets go of the lock f holds (LOCK_UN), whoever else shares its
// open file description: a child process forked meanwhile (by any
// goroutine: an exec.Command) shares it until its exec closes its copy,
// and the lock went with the last copy's close, not with f's. A lock
// shared on purpose with a child that holds it after this process (a
// reaper's) is the child's too: unlock it only once the child is done.
func Unlock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_UN)
		if !errors.Is(err, unix.EINTR) {
			if err != nil {
				return fmt.Errorf("filelock: unlock %s: %w", f.Name(), err)
			}
			return nil
		}
	}
}

// Close lets go of the lock f holds (Unlock) and closes f; nil does
// nothing. This, not f.Close, releases a lock: see Unlock.
func Close(f *os.File) error {
	if f == nil {
		return nil
	}
	uerr := Unlock(f)
	return errors.Join(uerr, f.Close())
}

// Open opens path (creating it, mode 0600) and locks it without waiting.
// A lock another holds is a *HeldError; the file is then closed.
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	if err := TryLock(f); err != nil {
		defer f.Close()
		if errors.Is(err, ErrLocked) {
			pid, shared := Holder(f)
			return nil, &HeldError{Path: path, PID: pid, Shared: shared}
		}
		return nil, err
	}
	return f, nil
}

// Wait opens path and locks it, trying again every interval for as long
// as the lock is held and wait (called after each refusal) says to, and
// ctx lasts. It returns Open's *HeldError once wait says not to, and
// ctx's error if ctx ends first.
func Wait(ctx context.Context, path string, every time.Duration, wait func() bool) (*os.File, error) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		f, err := Open(path)
		if !errors.Is(err, ErrLocked) || !wait() {
			return f, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// Holder is the process holding a flock on f's file, as /proc/locks
// tells it: its PID (0: unknown) and whether its lock is shared (LOCK_SH:
// udev probing a disk, say). A line is "ID: FLOCK ADVISORY WRITE|READ PID
// MAJ:MIN:INODE START END", the device numbers in hex; a waiter's has
// "->" after the ID.
func Holder(f *os.File) (pid int, shared bool) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, false
	}
	pl, err := os.Open("/proc/locks")
	if err != nil {
		return 0, false
	}
	defer pl.Close()
	exact := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	inode := ":" + strconv.FormatUint(st.Ino, 10)
	type holder struct {
		pid    int
		shared bool
	}
	// On some file systems (btrfs subvolumes, overlayfs) stat's device is
	// not the one /proc/locks names: then the inode alone, if only one
	// process locks an inode of that number.
	var exacts, byInode []holder
	sc := bufio.NewScanner(pl)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 6 || fl[1] != "FLOCK" || (fl[3] != "WRITE" && fl[3] != "READ") {
			continue
		}
		pid, err := strconv.Atoi(fl[4])
		if err != nil || pid <= 0 {
			continue
		}
		h := holder{pid: pid, shared: fl[3] == "READ"}
		switch {
		case fl[5] == exact:
			exacts = append(exacts, h)
		case strings.HasSuffix(fl[5], inode):
			byInode = append(byInode, h)
		}
	}
	hs := exacts
	if len(hs) == 0 && len(byInode) == 1 {
		hs = byInode
	}
	for _, h := range hs {
		if !h.shared {
			return h.pid, false
		}
	}
	if len(hs) > 0 {
		return hs[0].pid, true
	}
	return 0, false
}

// HolderNote describes a lock's holder for an error message: " (pid N,
// COMMAND)", " (pid N, this process)", or "" when unknown.
func HolderNote(pid int) string {
	switch {
	case pid <= 0:
		return ""
	case pid == os.Getpid():
		return fmt.Sprintf(" (pid %d, this process)", pid)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil {
		if comm := strings.TrimSpace(string(b)); comm != "" {
			return fmt.Sprintf(" (pid %d, %s)", pid, comm)
		}
	}
	return fmt.Sprintf(" (pid %d)", pid)
}
