package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/rialto-project/rialto/api"
)

// A fresh state directory (neither identity.json nor exports.json in it)
// is a first start, or a start whose state was lost: a state dir on
// tmpfs, or the default relative --state-dir started from another working
// directory. The agent cannot tell the two apart. In the second case the
// control plane knows the machine and may have leases active on its
// devices, which this agent does not know of and would never report, tear
// down or wipe: their ranges would go to the next tenant with the last
// one's bytes. So a fresh agent fails closed, as --wipe-lost-exports does:
// every block device whose file existed before it started is wiped in
// full (through the wipe journal, before anything is served), and its
// join tells the control plane that its exports are lost
// (api.JoinRequest.LostExports), which records the node's leases lost. A
// file the agent creates (sparse, empty) is not wiped; nor is anything on
// a genuinely new node's control plane lost (it knows no lease there).
//
// Nor is an agent still running on the same devices lost state: a second
// agent is refused before it looks at them (instancelock.go), whatever its
// state directory.

// freshState reports whether the state directory holds neither the
// agent's identity nor its exports file.
func (a *Agent) freshState() (bool, error) {
	for _, f := range []string{identityFile, exportsFile} {
		_, err := os.Lstat(filepath.Join(a.cfg.StateDir, f))
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("agent: state: %w", err)
		}
	}
	return true, nil
}

// wipeFreshState journals a wipe in full of each block device whose file
// existed before this start, then records in the identity that the next
// join tells the control plane the node's exports are lost. The journal
// is written first: a crash in between starts fresh again (and wipes
// again); once the identity is written, a restart is no longer fresh and
// finishes the journalled wipes like any others.
func (a *Agent) wipeFreshState(existed map[string]bool) error {
	n, err := a.journalWholeDevices("(fresh state)", func(d DeviceConfig) bool { return existed[d.Path] })
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.id.LostExports = true
	a.mu.Unlock()
	if err := a.saveIdentity(); err != nil {
		return err
	}
	if n > 0 {
		a.log.Warn("the state directory is new but block device files already exist and may hold tenants' bytes: they are wiped in full before anything is served, and the join has the control plane record this machine's leases lost",
			"devices", n, "state_dir", a.cfg.StateDir)
	} else {
		a.log.Info("the state directory is new; no block device file existed before", "state_dir", a.cfg.StateDir)
	}
	return nil
}

// journalWholeDevices journals a wipe of every block device in full that
// keep accepts, under the journal label lease, and persists the journal;
// it returns how many it journalled.
func (a *Agent) journalWholeDevices(lease string, keep func(DeviceConfig) bool) (int, error) {
	a.mu.Lock()
	n := 0
	for _, d := range a.devices {
		if d.Kind != api.KindBlock || d.Size <= 0 || !keep(d) {
			continue
		}
		a.wipes = append(a.wipes, &pendingWipe{wipeEntry: wipeEntry{LeaseID: lease, Kind: api.KindBlock,
			DeviceName: d.Name, DevicePath: d.Path, Length: d.Size}})
		n++
	}
	a.mPendingWipes.Set(float64(len(a.wipes)))
	a.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	return n, a.saveWipes()
}
