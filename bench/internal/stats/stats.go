// Package stats holds what every benchmark of bench/ records beside its
// figures: CPU time of server processes (from /proc/PID/stat), steal time
// (from /proc/stat), medians, and the conditions of a run (commit, machine,
// date) for the fragment it writes.
//
// The functions read /proc and run git; they hold no state and are safe for
// concurrent use.
package stats

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTick is USER_HZ, the unit of /proc/PID/stat's times (100 on Linux
// everywhere that matters; sysconf is not reachable without cgo).
const clockTick = 100

// ProcCPU returns the CPU seconds (user + system) a process has used, with
// those of its children it has reaped (cutime + cstime), and those of its
// live descendants: a server that forks a process per connection
// (nbd-server) is counted whole. A process that is gone counts 0.
func ProcCPU(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	total := ownCPU(pid)
	for _, c := range children(pid) {
		total += ProcCPU(c)
	}
	return total
}

// ownCPU reads utime+stime+cutime+cstime of one process.
func ownCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces; fields after ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is the state (field 3); utime is field 14, so f[11]..f[14].
	if len(f) < 15 {
		return 0
	}
	var ticks float64
	for _, s := range f[11:15] {
		v, _ := strconv.ParseFloat(s, 64)
		ticks += v
	}
	return ticks / clockTick
}

// children lists the live children of pid (from every thread's children
// file).
func children(pid int) []int {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// CPUSample is the machine-wide CPU time counters at one moment, in clock
// ticks. The zero value is "nothing read": a percentage against it is not
// measured.
type CPUSample struct{ steal, total float64 }

// SampleCPU reads the aggregate line of /proc/stat (the zero CPUSample when
// it cannot be read).
func SampleCPU() CPUSample {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUSample{}
	}
	s, _ := ParseCPU(string(b))
	return s
}

// ParseCPU parses the first line of /proc/stat ("cpu user nice system idle
// iowait irq softirq steal guest guest_nice"). The total is the sum of the
// first eight fields: guest and guest_nice are already counted in user and
// nice (proc(5)).
func ParseCPU(stat string) (CPUSample, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return CPUSample{}, fmt.Errorf("/proc/stat: want a \"cpu\" line with 8 counters, got %q", line)
	}
	var s CPUSample
	for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return CPUSample{}, fmt.Errorf("/proc/stat field %d: %w", i+1, err)
		}
		x := float64(n)
		s.total += x
		if i == 7 {
			s.steal = x
		}
	}
	return s, nil
}

// StealUntil returns the share of all CPU time stolen by the hypervisor
// between s and the later sample now, in percent; ok is false when no CPU
// time passed between them (or either sample is missing).
func (s CPUSample) StealUntil(now CPUSample) (pct float64, ok bool) {
	if s.total == 0 || now.total <= s.total {
		return 0, false
	}
	return 100 * (now.steal - s.steal) / (now.total - s.total), true
}

// StealPercent is StealUntil(now) with 0 when not measured.
func (s CPUSample) StealPercent(now CPUSample) float64 {
	pct, _ := s.StealUntil(now)
	return pct
}

// StealSince returns the share of all CPU time stolen by the hypervisor
// between s and this moment, in percent (0 when not measured).
func (s CPUSample) StealSince() float64 { return s.StealPercent(SampleCPU()) }

// Load returns the 1-minute load average.
func Load() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// Median of xs (NaN for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return nan
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

var nan = func() float64 { var z float64; return z / z }()

// Join formats xs with prec decimals, comma-separated.
func Join(xs []float64, prec int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return strings.Join(s, ", ")
}

// Commit returns the short commit of the working tree at dir and whether
// it has uncommitted changes outside docs/ (the fragments a run writes),
// as they were at the first call for dir: a bench calls it as it starts
// (before it builds and runs anything), so that a report written at the
// end names the tree that was measured, not one changed during the run.
func Commit(dir string) string {
	v, _ := commits.LoadOrStore(dir, sync.OnceValue(func() string { return commitNow(dir) }))
	return v.(func() string)()
}

var commits sync.Map // dir → func() string (sync.OnceValue)

func commitNow(dir string) string {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--", ".", ":!docs").Output()
	if err == nil && len(bytes.TrimSpace(st)) > 0 {
		return c + " (dirty: uncommitted changes)"
	}
	return c + " (clean)"
}

// Machine describes this machine in one line: vCPUs, memory, kernel, CPU
// model and Go version.
func Machine() string {
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				mem = fmt.Sprintf("%.1f GiB RAM", kb/(1<<20))
			}
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = "kernel " + strings.TrimSpace(string(b))
	}
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d vCPU, %s, %s, %s, %s", runtime.NumCPU(), mem, kernel, model, runtime.Version())
}

// Stamp is the UTC time a fragment is written, to the minute.
func Stamp() string { return time.Now().UTC().Format("2006-01-02 15:04 UTC") }

// Version returns the first line of `name args...`'s output (stdout or
// stderr), or "name (version unknown)".
func Version(name string, args ...string) string {
	out, _ := exec.Command(name, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if line == "" {
		return name + " (version unknown)"
	}
	return strings.TrimSpace(line)
}
