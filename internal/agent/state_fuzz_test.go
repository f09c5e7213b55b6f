package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// FuzzStateFiles feeds arbitrary identity.json and exports.json contents to
// what the agent does with them at start-up: load the identity, list the
// remembered ports, restore the exports. It must never panic; an unreadable
// exports file is left as it is; every port taken from a URI is a port
// number; the exports restored are ones Prepare accepts, and restoring the
// file they are saved to gives the same exports again.
func FuzzStateFiles(f *testing.F) {
	f.Add([]byte(`{"machine_id":"m","api_port":7000,"data_ports":{"block":10809}}`),
		[]byte(`[{"lease_id":"l","kind":"block","device_name":"disk0","offset":0,"length":4096,"export":"e","uri":"nbd://127.0.0.1:10809/e"}]`))
	f.Add([]byte(`{}`), []byte(`[{"lease_id":"l","kind":"memory","device_name":"mem0","length":1048576,"export":"m","uri":"rialto-mem://h:7/m","moved":"rialto-mem://h:8/m"},`+
		`{"lease_id":"l2","device_name":"disk0","offset":4096,"length":4096,"export":"b"}]`))
	f.Add([]byte(``), []byte(`[{"lease_id":"a","device_name":"disk0","export":"x","uri":"rialto-accel://h:1/x?slots=h:2,h:3"},`+
		`{"lease_id":"b","device_name":"disk0","offset":0,"length":8192,"export":"y"}]`))
	f.Add([]byte(`{"api_port":-1}`), []byte(`[{"lease_id":"a","device_name":"disk0","export":"x","uri":"rialto-accel://h:1/x?gateway=g"}]`))
	f.Add([]byte(`{}`), []byte(`[{"lease_id":"l","kind":"block","device_name":"disk0","offset":8192,"length":4096,"export":"rlp_m","move":"move-1","uri":"nbd://h:10809/rlp_m"}]`))
	f.Add([]byte(`null`), []byte(`{"lease_id":1}`))
	f.Fuzz(func(t *testing.T, identity, exports []byte) {
		a := offlineAgent(t)
		dir := a.cfg.StateDir
		if err := os.WriteFile(filepath.Join(dir, identityFile), identity, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, exportsFile), exports, 0o600); err != nil {
			t.Fatal(err)
		}
		if a.loadIdentity() != nil {
			return
		}
		saved, ok := a.savedExports()
		_ = a.rememberedPorts(saved)
		if !ok {
			if b, _ := os.ReadFile(filepath.Join(dir, exportsFile)); !bytes.Equal(b, exports) {
				t.Fatal("an unreadable exports file was changed")
			}
			return
		}
		for _, p := range saved {
			for _, uri := range []string{p.URI, p.Moved} {
				for _, port := range uriPorts(uri) {
					if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
						t.Fatalf("uriPorts(%q) returned port %q", uri, port)
					}
				}
			}
		}
		a.restoreExports(context.Background(), saved)
		got := restoredRequests(t, a)

		// A restart restores the same exports from the rewritten file.
		b := offlineAgent(t)
		rewritten, err := os.ReadFile(filepath.Join(dir, exportsFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(b.cfg.StateDir, exportsFile), rewritten, 0o600); err != nil {
			t.Fatal(err)
		}
		again, ok := b.savedExports()
		if !ok {
			t.Fatalf("the agent cannot read the exports file it wrote: %s", rewritten)
		}
		b.restoreExports(context.Background(), again)
		if got2 := restoredRequests(t, b); !reflect.DeepEqual(got, got2) {
			t.Fatalf("restoring the rewritten file gives %+v, not %+v", got2, got)
		}
	})
}

// restoredRequests returns a's exports' requests by export name, checking
// that each lies within its device.
func restoredRequests(t *testing.T, a *Agent) map[string]api.PrepareRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]api.PrepareRequest{}
	for name, e := range a.exports {
		r := e.Request
		dev, ok := a.devices[r.DeviceName]
		if !ok || r.Export != name || r.LeaseID == "" || r.Kind != dev.Kind ||
			r.Offset < 0 || r.Length <= 0 || r.Offset > dev.Size || r.Length > dev.Size-r.Offset {
			t.Fatalf("restored an export Prepare refuses: %+v", r)
		}
		out[name] = r
	}
	return out
}
