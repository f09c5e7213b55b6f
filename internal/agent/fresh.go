package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

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
// The record alone can be lost too: identity.json kept, exports.json
// deleted (by hand, a backup restored in part, a clean-up script). An
// agent that took that for "no exports" would join as the node it was,
// lending nothing as far as it knows, while the control plane keeps its
// leases active and their bytes stay on the devices, which no teardown
// would wipe: a teardown only wipes the ranges of exports the agent knows.
// So exports.json exists, even empty, for as long as identity.json does:
// every start writes it if absent once it knows its state (before its
// identity says so: identity.ExportsKept), and a start that finds an
// identity but no exports.json treats its state as lost, as a fresh one.
// That holds whether or not the identity says the file was kept: a state
// directory written by an agent that predates ExportsKept has no
// exports.json until its first export, but its exports.json may as well
// have been deleted before this version first started there, and nothing
// tells the two apart. Taking the absence for "no export ever" would lend
// the ranges of the leases it listed on unwiped; taking it for lost costs,
// once, a wipe of devices that held no tenant's bytes and a join that has
// the control plane record the node's leases lost (it has none, if
// there was never an export).
//
// Nor is an agent still running on the same devices lost state: a second
// agent is refused before it looks at them (instancelock.go), whatever its
// state directory.

// stateFiles says which of the state files exist.
type stateFiles struct {
	identity, exports bool
}

// statStateFiles looks for the state directory's identity and exports
// files.
func (a *Agent) statStateFiles() (stateFiles, error) {
	var s stateFiles
	for _, f := range []struct {
		name string
		have *bool
	}{{identityFile, &s.identity}, {exportsFile, &s.exports}} {
		_, err := os.Lstat(filepath.Join(a.cfg.StateDir, f.name))
		switch {
		case err == nil:
			*f.have = true
		case !errors.Is(err, fs.ErrNotExist):
			return s, fmt.Errorf("agent: state: %w", err)
		}
	}
	return s, nil
}

// lostState says why the state directory does not tell what the devices
// hold ("": it does): fresh (neither file), or its exports record gone
// while the identity is there, whether or not the identity says it kept
// one (an identity without the marker: an earlier version's state
// directory, whose exports.json may have been deleted too). Call it once
// the identity is loaded.
func (a *Agent) lostState(s stateFiles) string {
	a.mu.Lock()
	kept := a.id.ExportsKept
	a.mu.Unlock()
	switch {
	case !s.identity && !s.exports:
		return "fresh"
	case s.identity && !s.exports && kept:
		return "exports record missing"
	case s.identity && !s.exports:
		return "no exports record"
	}
	return ""
}

// wipeLostState journals a wipe in full of each block device whose file
// existed before this start, then records in the identity that the next
// join tells the control plane the node's exports are lost; why is
// lostState's. The journal is written first: a crash in between starts
// fresh again, or finds the record missing again (and wipes again); once
// the identity is written, a restart (exports.json being written next,
// keepExportsRecord) finishes the journalled wipes like any others.
func (a *Agent) wipeLostState(existed map[string]bool, why string) error {
	n, err := a.journalWholeDevices("("+why+")", func(d DeviceConfig) bool { return existed[d.Path] })
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.id.LostExports = true
	a.mu.Unlock()
	if err := a.saveIdentity(); err != nil {
		return err
	}
	switch {
	case why == "no exports record":
		a.log.Warn("identity.json is there but exports.json is not, and the identity, written by an earlier version or before its first export, does not say whether it ever had one: it may have been deleted, so the exports this agent served are unknown; every block device file that already existed is wiped in full before anything is served, and the join has the control plane record this machine's leases lost (once: the file is kept from now on)",
			"devices", n, "state_dir", a.cfg.StateDir)
	case why != "fresh":
		a.log.Warn("identity.json is there but exports.json, which it says was kept, is missing: the exports this agent served are unknown, so every block device file that already existed is wiped in full before anything is served, and the join has the control plane record this machine's leases lost",
			"devices", n, "state_dir", a.cfg.StateDir)
	case n > 0:
		a.log.Warn("the state directory is new but block device files already exist and may hold tenants' bytes: they are wiped in full before anything is served, and the join has the control plane record this machine's leases lost",
			"devices", n, "state_dir", a.cfg.StateDir)
	case slices.ContainsFunc(a.cfg.Devices, func(d DeviceConfig) bool { return d.Kind == api.KindBlock }):
		a.log.Info("the state directory is new; no block device file existed before", "state_dir", a.cfg.StateDir)
	default:
		a.log.Info("the state directory is new", "state_dir", a.cfg.StateDir)
	}
	return nil
}

// keepExportsRecord writes exports.json, with no export in it, if it is
// absent, then has the identity say the file is kept (ExportsKept): from
// then on a start without the file has lost it. In that order: a crash
// in between leaves a file and an identity that does not say so yet,
// which the next start takes as kept.
func (a *Agent) keepExportsRecord() error {
	a.mu.Lock()
	kept := a.id.ExportsKept
	a.id.ExportsKept = true
	a.mu.Unlock()
	if _, err := os.Lstat(filepath.Join(a.cfg.StateDir, exportsFile)); errors.Is(err, fs.ErrNotExist) {
		a.opMu.Lock()
		err := a.saveExportsLocked()
		a.opMu.Unlock()
		if err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("agent: state: %w", err)
	}
	if kept {
		return nil
	}
	return a.saveIdentity()
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
