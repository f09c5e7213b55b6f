package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestPrepareRefusalsReadPlainly: what a running agent answers when it
// refuses a prepare — the words a tenant reads in a failed lease's reason
// — says what is wrong with the device, without the lease's ID, the
// agent's steps or packages, or the lender's host paths; the agent's log
// keeps the whole error. They read "agent: prepare lease-1 on disk0: nbd:
// open backend: open /…/disk0.img: no such file or directory".
func TestPrepareRefusalsReadPlainly(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	log := &logtest.Buffer{}
	cfg := testConfig(srv.URL, dir)
	cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	r := start(t, cfg)
	a := r.a
	block := func(lease string, off int64) api.PrepareRequest {
		return api.PrepareRequest{LeaseID: lease, Kind: api.KindBlock, Mode: api.ModeShared, DeviceName: "disk0",
			Offset: off, Length: 256 << 10, Export: "rlc_" + lease}
	}
	// A range being wiped (a move into it not decided yet).
	a.mu.Lock()
	dev := a.devices["disk0"]
	a.mu.Unlock()
	if _, err := a.journalWipe(Export{Request: block("lease-wiped", 768<<10), Device: dev}, true); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		setup  func()
		key    string
		req    api.PrepareRequest
		status int
		want   string
	}{
		{"out of capacity", nil, "key-1", block("lease-big", 1<<20), 400,
			"device disk0 has no room for the part (offset 1048576, length 262144; the device has 1048576)"},
		{"range being wiped", nil, "key-1", block("lease-w", 768<<10), 409,
			"the range of device disk0 is still being wiped after an earlier lease"},
		{"unknown role", nil, "key-1", api.PrepareRequest{LeaseID: "lease-r", Kind: api.KindAccel, DeviceName: "gpu",
			Offset: 0, Length: api.SlotUnits, Export: "rlc_r", Role: "no-such-role"}, 400,
			`device gpu cannot load role "no-such-role" (no such role)`},
		{"wrong agent key", nil, "key-2", block("lease-k", 0), 401,
			"the control plane's agent key is not the one this lender was given at its last join"},
		{"no agent key", nil, "", block("lease-k", 0), 401, "the call carried no agent key"},
		{"backing file missing", func() {
			if err := os.Remove(filepath.Join(dir, "disk0.img")); err != nil {
				t.Fatal(err)
			}
		}, "key-1", block("lease-gone", 0), 500, "device disk0 cannot be opened (no such file or directory)"},
	} {
		if tc.setup != nil {
			tc.setup()
		}
		resp, body := call(t, a, tc.key, "/agent/v1/prepare", tc.req)
		var eb api.ErrorBody
		if err := json.Unmarshal(body, &eb); err != nil {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
		if resp.StatusCode != tc.status || eb.Error.Message != tc.want {
			t.Errorf("%s: answered %d %q, want %d %q", tc.name, resp.StatusCode, eb.Error.Message, tc.status, tc.want)
		}
		for _, w := range []string{tc.req.LeaseID, dir, "agent: ", "nbd: ", "open backend", "prepare "} {
			if strings.Contains(eb.Error.Message, w) {
				t.Errorf("%s: the answer carries %q: %s", tc.name, w, eb.Error.Message)
			}
		}
	}
	if !strings.Contains(log.String(), "prepare lease-gone on disk0: nbd: open backend: open "+filepath.Join(dir, "disk0.img")) {
		t.Errorf("the agent's log lacks the whole error of the missing backing file:\n%s", log.String())
	}
}

// TestPublicDeviceWords: each common failure of a device reads by its
// cause; an unknown one gives no text of its own.
func TestPublicDeviceWords(t *testing.T) {
	req := api.PrepareRequest{LeaseID: "lease-x", Role: "mct"}
	open := func(errno syscall.Errno) error {
		return fmt.Errorf("nbd: open backend: %w", &fs.PathError{Op: "open", Path: "/srv/secret/d0.img", Err: errno})
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{open(syscall.ENOENT), "device d0 cannot be opened (no such file or directory)"},
		{open(syscall.EACCES), "device d0 cannot be opened (permission denied)"},
		{open(syscall.EBUSY), "device d0 is busy (another program holds it)"},
		{fmt.Errorf("agent: block device d0 (/dev/sdb) is in use: %w", ErrInUse), "device d0 is busy (another program holds it)"},
		{open(syscall.ENOSPC), "device d0 is out of space"},
		// The state directory full is not the device full.
		{fmt.Errorf("%w: %w", errWriteState, &fs.PathError{Op: "write", Path: "/srv/state/.exports.json.1", Err: syscall.ENOSPC}),
			"the lender's agent cannot record the export of device d0: its state directory is out of space"},
		// A state directory gone (ENOENT) is not a device file missing.
		{writeJSON(filepath.Join(t.TempDir(), "gone", "exports.json"), 1),
			"the lender's agent cannot record the export of device d0 (its log says why)"},
		{open(syscall.EROFS), "device d0 is read-only"},
		{open(syscall.ENXIO), "device d0 is not present (no such device)"},
		{open(syscall.EIO), "device d0 failed to read or write (input/output error)"},
		{open(syscall.ELOOP), "device d0 could not be prepared (too many levels of symbolic links)"},
		{fmt.Errorf("appliance: %w: mct", roles.ErrUnknownRole), `device d0 cannot load role "mct" (no such role)`},
		{fmt.Errorf("%w: %w: empty module", ErrBadRequest, roles.ErrBadModule), `device d0 cannot load role "mct": empty module`},
		{fmt.Errorf("%w: d0 is not open", ErrNoDevice), "no such device: d0 is not open"},
		{errors.New("stripe: something /srv/secret went wrong"), "device d0 could not be prepared (the lender's agent log says why)"},
	} {
		err := deviceRefusal("prepare", req, "d0", c.err)
		if got := publicMessage(err); got != c.want {
			t.Errorf("%v: answered %q, want %q", c.err, got, c.want)
		}
		if !errors.Is(err, c.err) || !strings.HasPrefix(err.Error(), "agent: prepare lease-x on d0: ") {
			t.Errorf("%v: the log's error lost its story: %v", c.err, err)
		}
	}
	if got := publicMessage(errors.New("agent: write /srv/state/exports.json: disk full")); strings.Contains(got, "/srv") {
		t.Errorf("an error of the agent's own answered with its path: %q", got)
	}
}
