package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// FuzzWipeJournal feeds arbitrary wipes.json contents (a journal a crash,
// a full disk or a hand edit left) to what a starting agent does with
// it: load it, then wipe every entry. It must never panic; a journal it
// cannot read is refused with an error naming it and left as it is; a
// wipe never writes outside the device it names (the device's file keeps
// its size, and every byte outside the entries' ranges of that device is
// the tenant's still); a range whose wipe succeeded reads as zeroes and
// left the journal, and the journal lists exactly the entries not wiped.
func FuzzWipeJournal(f *testing.F) {
	for _, s := range []string{
		`[{"lease_id":"l","kind":"block","device_name":"disk0","offset":4096,"length":8192}]`,
		`[{"lease_id":"l","kind":"block","device_name":"disk0","device_path":"disk0.img","offset":0,"length":65536},` +
			`{"lease_id":"m","kind":"block","device_name":"gone","offset":0,"length":4096}]`,
		`[{"lease_id":"l","kind":"block","device_name":"disk0","offset":61440,"length":8192}]`,
		`[{"lease_id":"l","kind":"block","device_name":"disk0","offset":-4096,"length":8192}]`,
		`[{"lease_id":"l","kind":"block","device_name":"disk0","offset":1048576,"length":4096}]`,
		`[{"lease_id":"l","kind":"block","device_name":"disk0","offset":100,"length":1000}]`,
		`[{"lease_id":"l","kind":"block","device_name":"disk0","offset":9223372036854775807,"length":9223372036854775807}]`,
		`[{"lease_id":"l","kind":"memory","device_name":"disk0","offset":0,"length":4096}]`,
		`[]`, `null`, ``, `{}`, `[{"offset":"x"}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, journal []byte) { runWipeJournalOnce(t, journal) })
}

// runWipeJournalOnce is one run of FuzzWipeJournal.
func runWipeJournalOnce(t *testing.T, journal []byte) {
	const size = 64 << 10
	pattern := bytes.Repeat([]byte("tenant bytes "), size/13+1)[:size]
	dir := t.TempDir()
	img := filepath.Join(dir, "disk0.img")
	if err := os.WriteFile(img, pattern, 0o600); err != nil {
		t.Fatal(err)
	}
	bd := NewBlockDriver(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer bd.Close()
	a, err := New(Config{ControlPlane: "http://127.0.0.1:1", BootstrapToken: "b", Name: "n", StateDir: dir,
		Devices: []DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: size}},
		Drivers: map[api.Kind]Driver{api.KindBlock: bd}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := a.openDevices(ctx); err != nil {
		t.Fatal(err)
	}
	jpath := filepath.Join(dir, wipesFile)
	if err := os.WriteFile(jpath, journal, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.loadWipes(); err != nil {
		if !strings.Contains(err.Error(), wipesFile) {
			t.Fatalf("the refusal does not name the journal: %v", err)
		}
		if b, _ := os.ReadFile(jpath); !bytes.Equal(b, journal) {
			t.Fatal("an unreadable journal was changed")
		}
		return
	}
	a.mu.Lock()
	loaded := make([]wipeEntry, len(a.wipes))
	for i, w := range a.wipes {
		loaded[i] = w.wipeEntry
	}
	a.mu.Unlock()
	_ = a.retryWipes(ctx)

	a.mu.Lock()
	left := map[wipeEntry]int{}
	for _, w := range a.wipes {
		left[w.wipeEntry]++
	}
	a.mu.Unlock()
	var saved []wipeEntry
	if b, err := os.ReadFile(jpath); err == nil && len(b) > 0 {
		if err := json.Unmarshal(b, &saved); err != nil {
			t.Fatalf("the journal the agent wrote does not read back: %v", err)
		}
	}
	onFile := map[wipeEntry]int{}
	for _, w := range saved {
		onFile[w]++
	}
	disk, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if len(disk) != size {
		t.Fatalf("the device's file is %d bytes after the wipes, not %d", len(disk), size)
	}
	// What each entry may zero: its range, clipped to the device,
	// when it names the device.
	mayZero := make([]bool, size)
	for _, w := range loaded {
		if (w.DevicePath == "" && w.DeviceName != "disk0") || (w.DevicePath != "" && !sameFile(w.DevicePath, img)) {
			continue
		}
		lo, hi := max(w.Offset, 0), w.Offset+w.Length
		if hi < w.Offset || hi > size { // overflowing, or past the end
			hi = size
		}
		for i := lo; i < hi; i++ {
			mayZero[i] = true
		}
	}
	for i := range disk {
		if !mayZero[i] && disk[i] != pattern[i] {
			t.Fatalf("byte %d, outside every journalled range, changed by the wipes (journal %s)", i, journal)
		}
	}
	wiped := map[wipeEntry]int{}
	for _, w := range loaded {
		wiped[w]++
	}
	for w, n := range left {
		wiped[w] -= n
	}
	for w, n := range wiped {
		if n < 0 {
			t.Fatalf("entry %+v left more often than it was journalled", w)
		}
		if n > 0 && w.Length > 0 && w.Offset >= 0 && w.Offset <= size-w.Length &&
			!bytes.Equal(disk[w.Offset:w.Offset+w.Length], make([]byte, w.Length)) {
			t.Fatalf("entry %+v left the journal but its range is not zero", w)
		}
	}
	if len(saved) > 0 || len(left) > 0 {
		for w, n := range left {
			if onFile[w] != n {
				t.Fatalf("entry %+v pending %d times, on file %d", w, n, onFile[w])
			}
		}
		if len(onFile) != len(left) {
			t.Fatalf("the journal lists %+v, the agent has %+v pending", saved, left)
		}
	}
}
