package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestSecondAgentOnLentNICRefused: a NIC an agent lends (its lock held,
// as a running agent holds it) is refused to a second agent on another
// state directory, naming the NIC and the process holding it, before the
// second opens (configures) anything. Once the first lets go, the second
// gets past the lock. Two devices of one agent on one interface are a
// configuration error.
func TestSecondAgentOnLentNICRefused(t *testing.T) {
	_, srv := newFakeCP(t)
	iface := fmt.Sprintf("rt-lock%d", os.Getpid()%100000) // no such interface: nothing opens it
	nicCfg := func() Config {
		cfg := testConfig(srv.URL, t.TempDir())
		cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "wan", Kind: api.KindNIC, Path: iface, Size: 1 << 20})
		return cfg
	}
	first, err := New(nicCfg())
	if err != nil {
		t.Fatal(err)
	}
	var held instanceLocks
	if err := first.lockNICs(&held); err != nil {
		t.Fatal(err)
	}
	defer held.release()

	err = refusedStart(t, nicCfg())
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("a second agent lending %s: %v, want ErrInUse", iface, err)
	}
	want := fmt.Sprintf("NIC wan (%s) is in use by another rialto agent (pid %d, this process)", iface, os.Getpid())
	if !strings.Contains(err.Error(), want) {
		t.Errorf("the refusal %q does not say %q", err, want)
	}

	held.release()
	if err := refusedStart(t, nicCfg()); errors.Is(err, ErrInUse) {
		t.Fatalf("a start once the NIC's lock is let go: %v", err)
	}

	cfg := nicCfg()
	cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "wan2", Kind: api.KindNIC, Path: iface, Size: 1 << 20})
	if err := refusedStart(t, cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("two NIC devices on one interface: %v, want ErrConfig", err)
	}
}
