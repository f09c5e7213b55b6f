package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/sharertest"
)

// lentNIC is the config of an agent lending a NIC, iface (prefix and a
// number: no such interface, nothing opens it), and the locks a first
// agent of it holds on the NIC.
func lentNIC(t *testing.T, prefix string) (nicCfg func() Config, held *instanceLocks, iface string) {
	t.Helper()
	_, srv := newFakeCP(t)
	iface = fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
	nicCfg = func() Config {
		cfg := testConfig(srv.URL, t.TempDir())
		cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "wan", Kind: api.KindNIC, Path: iface, Size: 1 << 20})
		return cfg
	}
	first, err := New(nicCfg())
	if err != nil {
		t.Fatal(err)
	}
	held = new(instanceLocks)
	if err := first.lockNICs(ctxFor(t), held); err != nil {
		t.Fatal(err)
	}
	return nicCfg, held, iface
}

// TestSecondAgentOnLentNICRefused: a NIC an agent lends (its lock held,
// as a running agent holds it) is refused to a second agent on another
// state directory, naming the NIC and the process holding it, before the
// second opens (configures) anything. Once the first lets go, the second
// gets past the lock. Two devices of one agent on one interface are a
// configuration error.
func TestSecondAgentOnLentNICRefused(t *testing.T) {
	nicCfg, held, iface := lentNIC(t, "rt-lock")
	defer held.release()

	// A running agent's lock is refused at once, not tried again.
	cfg := nicCfg()
	log := recorder{msgs: make(chan string, 64)}
	cfg.Logger = slog.New(log)
	err := refusedStart(t, cfg)
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("a second agent lending %s: %v, want ErrInUse", iface, err)
	}
	for len(log.msgs) > 0 {
		if m := <-log.msgs; strings.HasPrefix(m, nicRetried) {
			t.Errorf("a running agent's NIC lock was tried again: %q", m)
		}
	}
	want := fmt.Sprintf("NIC wan (%s) is in use by another rialto agent (pid %d, this process)", iface, os.Getpid())
	if !strings.Contains(err.Error(), want) {
		t.Errorf("the refusal %q does not say %q", err, want)
	}

	held.release()
	if err := refusedStart(t, nicCfg()); errors.Is(err, ErrInUse) {
		t.Fatalf("a start once the NIC's lock is let go: %v", err)
	}

	cfg = nicCfg()
	cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "wan2", Kind: api.KindNIC, Path: iface, Size: 1 << 20})
	if err := refusedStart(t, cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("two NIC devices on one interface: %v, want ErrConfig", err)
	}
}

// nicRetried begins what the agent logs when it tries a NIC's lock again.
const nicRetried = "NIC lock let go but still bound, for now"

// TestNICLockLetGoWhileAChildSharesIt: a NIC's lock that the agent
// holding it let go, but a child process of its process still shares
// until its exec, is the next agent's once the child lets go, within
// claimSettle: the name is tried again while no running agent holds it.
// The socket stays bound while any descriptor of it is open, and the next
// agent of the process (a restart in the test cluster) was refused at
// once as if another agent lent the NIC.
func TestNICLockLetGoWhileAChildSharesIt(t *testing.T) {
	nicCfg, held, _ := lentNIC(t, "rt-let")
	end := sharertest.Share(t, held.files...)
	held.release()

	cfg := nicCfg()
	log := recorder{msgs: make(chan string, 16)}
	cfg.Logger = slog.New(log)
	next, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var l instanceLocks
	defer l.release()
	done := make(chan error, 1)
	go func() { done <- next.lockNICs(ctxFor(t), &l) }()
	for tried := false; !tried; {
		select {
		case m := <-log.msgs:
			tried = strings.HasPrefix(m, nicRetried)
		case err := <-done:
			t.Fatalf("the NIC lock a child shares for now: %v, want it tried again", err)
		}
	}
	end()
	if err := within(t, done, "the NIC lock not taken once the child let go"); err != nil {
		t.Fatalf("the NIC lock once the child let go: %v", err)
	}
}
