package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/rialto-project/rialto/api"
)

// identity is what the agent persists about itself (identity.json, 0600).
type identity struct {
	MachineID string `json:"machine_id"`
	NodeID    string `json:"node_id,omitempty"`
	// Credential is the node credential the last join answered. Loading
	// drops one longer than api.MaxCredentialLen (a file edited by hand
	// or damaged), which the control plane refuses in every join.
	Credential string           `json:"credential,omitempty"`
	AgentKey   string           `json:"agent_key,omitempty"`
	APIPort    int              `json:"api_port,omitempty"`
	DataPorts  map[api.Kind]int `json:"data_ports,omitempty"`
	// PreviousCredentials are the node credentials earlier joins
	// answered, newest first, at most api.MaxPreviousCredentials: a join
	// presents them with Credential (api.JoinRequest), so that a control
	// plane whose database was restored from a backup, which knows one of
	// them and not the current one, takes the join for the node's agent's.
	// Loading keeps only those a join can present
	// (validPreviousCredentials): a file edited by hand or damaged would
	// otherwise have every join refused.
	PreviousCredentials []string `json:"previous_credentials,omitempty"`
	// LostExports: exports.json was unreadable and set aside
	// (--wipe-lost-exports); the next join tells the control plane that
	// the node's leases are lost (api.JoinRequest.LostExports).
	LostExports bool `json:"lost_exports,omitempty"`
	// ExportsKept: exports.json exists, even with no export in it, for
	// as long as this identity does (fresh.go). Unset in a state
	// directory written by an agent that did not keep the file before its
	// first export. A start that finds an identity and no exports.json
	// takes the record for lost either way; the marker only says which
	// (the log's and the wipe journal's reason).
	ExportsKept bool `json:"exports_kept,omitempty"`
}

const (
	identityFile = "identity.json"
	exportsFile  = "exports.json"
)

// readJSON decodes path into v; a missing file leaves v untouched.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("agent: read state: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("agent: decode %s: %w", filepath.Base(path), err)
	}
	return nil
}

// errWriteState wraps a failure to record the agent's state in its state
// directory (writeJSON): a full state directory is not a full device
// (publicDeviceWords).
var errWriteState = errors.New("agent: write state")

// writeJSON replaces path atomically and durably with v, readable by the
// owner only.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("agent: encode state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("%w: %w", errWriteState, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("%w: %w", errWriteState, err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("%w: %w", errWriteState, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("%w: %w", errWriteState, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("%w: %w", errWriteState, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("%w: %w", errWriteState, err)
	}
	// The rename is durable once the directory is.
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("%w: %w", errWriteState, err)
	}
	err = d.Sync()
	d.Close()
	if err != nil {
		return fmt.Errorf("%w: %w", errWriteState, err)
	}
	return nil
}

// persistedExport is one entry of exports.json: the prepare request and
// the URI the export was served at. The request's fields are inlined, so
// that a file written before URIs were kept (a list of bare requests)
// reads as entries without a URI, and an older agent reads this one.
type persistedExport struct {
	api.PrepareRequest
	URI string `json:"uri,omitempty"`
	// Moved is a new address not yet acknowledged by the control plane
	// (Export.Moved). A restart reports the restored export's address
	// whatever it is, since the control plane may have recorded Moved
	// without the agent learning it.
	Moved string `json:"moved,omitempty"`
	// DevicePath is the device's path when the export was prepared, so
	// that a restart finds the range of a device renamed in the
	// configuration since (journalUnrestorable).
	DevicePath string `json:"device_path,omitempty"`
	// Lost says why the export is gone (its data lived in the agent's
	// process: Ephemeral): it is not served, only reported lost until
	// the control plane acknowledges it.
	Lost string `json:"lost,omitempty"`
}

// sortedExports returns the exports, then the lost ones, ordered by
// export name, for stable state files.
func sortedExports(m map[string]Export, lost map[string]persistedExport) []persistedExport {
	out := make([]persistedExport, 0, len(m)+len(lost))
	for _, e := range m {
		if e.incoming {
			continue // in the wipe journal until committed
		}
		out = append(out, persistedExport{PrepareRequest: e.Request, URI: e.URI, Moved: e.Moved, DevicePath: e.Device.Path})
	}
	for name, p := range lost {
		if _, ok := m[name]; !ok {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Export < out[j].Export })
	return out
}
