package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair: what is written to tty is read
// from master.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

// TestProgressOnTerminal: with stderr a terminal, long work draws a bar
// (its text and step count reach the terminal).
func TestProgressOnTerminal(t *testing.T) {
	master, tty := openPTY(t)
	got := make(chan string, 1)
	go func() {
		var all strings.Builder
		buf := make([]byte, 4096)
		for !strings.Contains(all.String(), "measuring 2 of 3") || !strings.Contains(all.String(), "(1/3)") {
			n, err := master.Read(buf)
			all.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- all.String()
	}()
	e := &env{stderr: tty}
	p := newProgress(e, 3, "measuring 1 of 3")
	if p == nil {
		t.Fatal("no bar on a terminal")
	}
	p.step("measuring 2 of 3")
	select {
	case s := <-got:
		if !strings.Contains(s, "(1/3)") {
			t.Errorf("the bar shows no step count:\n%q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing drawn on the terminal")
	}
	p.done()
	master.Close() // ends the reader
}

// TestSimRunProgressOnTerminal: `rialto sim run` draws its bar on a
// terminal stderr; its stdout (the figures) is the same either way.
func TestSimRunProgressOnTerminal(t *testing.T) {
	master, tty := openPTY(t)
	got := make(chan string, 1)
	go func() {
		var all strings.Builder
		buf := make([]byte, 4096)
		for !strings.Contains(all.String(), "sim: smufin-sharing") {
			n, err := master.Read(buf)
			all.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- all.String()
	}()
	var out strings.Builder
	e := &env{stdout: &out, stderr: tty, getenv: func(string) string { return "" }}
	if code := run(t.Context(), []string{"sim", "run", "smufin-sharing", "--out", t.TempDir(), "--seed", "7"}, e); code != 0 {
		t.Fatalf("exit %d", code)
	}
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("no bar on the terminal")
	}
	plain, _, _ := runCLI(t, "", "sim", "run", "smufin-sharing", "--out", t.TempDir(), "--seed", "7")
	if out.String() == "" || stripDirs(out.String()) != stripDirs(plain) {
		t.Errorf("stdout differs with a terminal stderr:\n%s\n---\n%s", out.String(), plain)
	}
}

// stripDirs drops the lines that name the output directory or timings.
func stripDirs(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, "wrote ") && !strings.Contains(l, "took ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
