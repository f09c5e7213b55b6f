package nbd

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// need skips the test when a third-party tool is not installed.
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

// fastDir is a directory on tmpfs when one is available.
func fastDir(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "nbdtest")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// serveFile exports a sparse file of size bytes and returns its path and URI.
func serveFile(t *testing.T, dir string, size int64, readOnly bool) (string, string) {
	t.Helper()
	p := filepath.Join(dir, "served.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	b, err := OpenFile(p, FileOptions{ReadOnly: readOnly})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	_, addr := startServer(t, Export{Name: testName, Description: "rialto test", Backend: b, ReadOnly: readOnly})
	return p, URI{Network: "tcp", Address: addr, Export: testName}.String()
}

func TestInteropNbdinfo(t *testing.T) {
	need(t, "nbdinfo")
	for _, ro := range []bool{false, true} {
		_, uri := serveFile(t, t.TempDir(), 64<<20, ro)
		var info struct {
			Structured bool `json:"structured"`
			Exports    []struct {
				Size       int64    `json:"export-size"`
				ReadOnly   bool     `json:"is_read_only"`
				Flush      bool     `json:"can_flush"`
				FUA        bool     `json:"can_fua"`
				Trim       bool     `json:"can_trim"`
				Zero       bool     `json:"can_zero"`
				MultiConn  bool     `json:"can_multi_conn"`
				Contexts   []string `json:"contexts"`
				MinBlock   int      `json:"block_size_minimum"`
				MaxBlock   int      `json:"block_size_maximum"`
				Desc       string   `json:"description"`
				ExportName string   `json:"export-name"`
			} `json:"exports"`
		}
		if err := json.Unmarshal([]byte(run(t, "nbdinfo", "--json", uri)), &info); err != nil {
			t.Fatal(err)
		}
		if len(info.Exports) != 1 {
			t.Fatalf("exports: %+v", info)
		}
		e := info.Exports[0]
		if !info.Structured || e.Size != 64<<20 || e.ReadOnly != ro || !e.Flush || !e.FUA || e.Trim == ro || !e.Zero ||
			!e.MultiConn || len(e.Contexts) != 1 || e.Contexts[0] != MetaContextBaseAllocation || e.MaxBlock != 32<<20 {
			t.Fatalf("nbdinfo (read-only %v): %+v", ro, info)
		}
		// --list is refused: export names are credentials.
		base := strings.TrimSuffix(uri, testName)
		out, err := exec.Command("nbdinfo", "--list", base).CombinedOutput()
		if err == nil || strings.Contains(string(out), testName) {
			t.Fatalf("nbdinfo --list succeeded or revealed the name (err %v):\n%s", err, out)
		}
		// A wrong name is refused without detail.
		out, err = exec.Command("nbdinfo", base+"wrong").CombinedOutput()
		if err == nil || strings.Contains(string(out), testName) {
			t.Fatalf("nbdinfo on a wrong name: %v\n%s", err, out)
		}
	}
}

func fileSum(t *testing.T, p string) [32]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// writeRandom fills p with size pseudo-random bytes and returns their SHA-256.
func writeRandom(t *testing.T, p string, size int) [32]byte {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// One random block, varied per block so that no two blocks are equal
	// (cheap under -race, unlike a Go PRNG over the whole size).
	h := sha256.New()
	buf := make([]byte, 4<<20)
	rand.Read(buf)
	for done := 0; done < size; done += len(buf) {
		b := buf[:min(len(buf), size-done)]
		binary.LittleEndian.PutUint64(b, uint64(done))
		h.Write(b)
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// TestInteropNbdcopy256MiB round-trips 256 MiB of random data through nbdcopy
// (which uses several connections thanks to CAN_MULTI_CONN).
func TestInteropNbdcopy256MiB(t *testing.T) {
	need(t, "nbdcopy")
	const size = 256 << 20
	dir := fastDir(t)
	_, uri := serveFile(t, dir, size, false)
	src := filepath.Join(dir, "src.img")
	dst := filepath.Join(dir, "dst.img")
	want := writeRandom(t, src, size)
	start := time.Now()
	run(t, "nbdcopy", src, uri)
	t.Logf("nbdcopy write: %v", time.Since(start))
	start = time.Now()
	run(t, "nbdcopy", uri, dst)
	t.Logf("nbdcopy read: %v", time.Since(start))
	if got := fileSum(t, dst); got != want {
		t.Fatal("nbdcopy round trip: checksums differ")
	}
}

func TestInteropQemu(t *testing.T) {
	need(t, "qemu-img", "qemu-io", "nbdcopy")
	dir := fastDir(t)
	const size = 32 << 20
	served, uri := serveFile(t, dir, size, false)
	src := filepath.Join(dir, "src.img")
	writeRandom(t, src, size)
	run(t, "nbdcopy", "--no-extents", src, uri)
	run(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, uri)
	out := run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri)
	if !strings.Contains(out, "identical") {
		t.Fatalf("qemu-img compare: %s", out)
	}
	out = run(t, "qemu-io", "-f", "raw",
		"-c", "write -P 0xa5 0 1M",
		"-c", "read -P 0xa5 0 1M",
		"-c", "write -P 0x3c -f 1M 64k", // FUA
		"-c", "read -P 0x3c 1M 64k",
		"-c", "write -z 2M 1M",
		"-c", "read -P 0 2M 1M",
		"-c", "discard 4M 1M",
		"-c", "flush",
		"-c", "aio_write -P 0x11 8M 4k",
		"-c", "aio_write -P 0x22 9M 4k",
		"-c", "aio_flush",
		"-c", "read -P 0x11 8M 4k",
		"-c", "read -P 0x22 9M 4k",
		uri)
	if strings.Contains(out, "failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io:\n%s", out)
	}
	raw, _ := os.ReadFile(served)
	if !bytes.Equal(raw[:1<<20], bytes.Repeat([]byte{0xa5}, 1<<20)) {
		t.Fatal("qemu-io write not in the served file")
	}
	bad, _ := exec.Command("qemu-io", "-f", "raw", "-c", "read -P 0x77 0 4k", uri).CombinedOutput()
	if out = string(bad); !strings.Contains(out, "Pattern verification failed") {
		t.Fatalf("qemu-io pattern check did not detect a mismatch:\n%s", out)
	}
}

func TestInteropFioVerify(t *testing.T) {
	need(t, "fio")
	_, uri := serveFile(t, fastDir(t), 32<<20, false)
	out := run(t, "fio", "--name=verify", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bs=4k",
		"--size=32M", "--iodepth=16", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0")
	if !strings.Contains(out, "verify") || strings.Contains(out, "err=") && !strings.Contains(out, "err= 0") {
		t.Fatalf("fio:\n%s", out)
	}
}
