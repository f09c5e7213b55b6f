package roles

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/cmplx"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

func mustNew(t *testing.T, s Spec) Role {
	t.Helper()
	r, err := New(context.Background(), s)
	if err != nil {
		t.Fatalf("New(%s): %v", s.Name, err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

func naiveDFT(x []complex128, inverse bool) []complex128 {
	n := len(x)
	out := make([]complex128, n)
	sign := -1.0
	if inverse {
		sign = 1
	}
	for k := 0; k < n; k++ {
		var s complex128
		for j := 0; j < n; j++ {
			s += x[j] * cmplx.Exp(complex(0, sign*2*math.Pi*float64(j*k)/float64(n)))
		}
		if inverse {
			s /= complex(float64(n), 0)
		}
		out[k] = s
	}
	return out
}

func TestFFTAgainstDFT(t *testing.T) {
	r := mustNew(t, Spec{Name: "fft"})
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 4, 8, 64, 256, 1024} {
		for _, inv := range []bool{false, true} {
			x := make([]complex128, n)
			for i := range x {
				x[i] = complex(rng.NormFloat64(), rng.NormFloat64())
			}
			entry := "forward"
			if inv {
				entry = "inverse"
			}
			out, err := r.Run(context.Background(), entry, EncodeComplex(x))
			if err != nil {
				t.Fatal(err)
			}
			got, want := DecodeComplex(out), naiveDFT(x, inv)
			for i := range want {
				if cmplx.Abs(got[i]-want[i]) > 1e-9*float64(n) {
					t.Fatalf("n=%d inv=%v bin %d: %v want %v", n, inv, i, got[i], want[i])
				}
			}
		}
	}
}

func TestSHA256AndEcho(t *testing.T) {
	sha, echo := mustNew(t, Spec{Name: "sha256"}), mustNew(t, Spec{Name: "echo"})
	for _, n := range []int{0, 1, 55, 56, 64, 1000, 1 << 16} {
		in := bytes.Repeat([]byte{byte(n)}, n)
		got, err := sha.Run(context.Background(), "sum", in)
		want := sha256.Sum256(in)
		if err != nil || !bytes.Equal(got, want[:]) {
			t.Fatalf("sha256 n=%d: %x %v", n, got, err)
		}
		e, err := echo.Run(context.Background(), "echo", in)
		if err != nil || !bytes.Equal(e, in) {
			t.Fatalf("echo n=%d: %v", n, err)
		}
	}
}

func TestAESGCMAgainstStdlib(t *testing.T) {
	for _, klen := range []int{16, 24, 32} {
		key := bytes.Repeat([]byte{7}, klen)
		r := mustNew(t, Spec{Name: "aesgcm", Config: key})
		b, _ := aes.NewCipher(key)
		g, _ := cipher.NewGCM(b)
		nonce := []byte("012345678901")
		for _, n := range []int{0, 1, 16, 1000} {
			pt := bytes.Repeat([]byte{'p'}, n)
			ct, err := r.Run(context.Background(), "seal", append(append([]byte{}, nonce...), pt...))
			if err != nil {
				t.Fatal(err)
			}
			if want := g.Seal(nil, nonce, pt, nil); !bytes.Equal(ct, want) {
				t.Fatalf("seal k=%d n=%d mismatch", klen, n)
			}
			back, err := r.Run(context.Background(), "open", append(append([]byte{}, nonce...), ct...))
			if err != nil || !bytes.Equal(back, pt) {
				t.Fatalf("open k=%d n=%d: %v", klen, n, err)
			}
			ct[len(ct)-1] ^= 1
			if _, err := r.Run(context.Background(), "open", append(append([]byte{}, nonce...), ct...)); !errors.Is(err, ErrBadInput) {
				t.Fatalf("tampered ciphertext: %v", err)
			}
		}
	}
	if _, err := New(context.Background(), Spec{Name: "aesgcm", Config: []byte("short")}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("short key: %v", err)
	}
}

func encMatmul(m, k, n int, a, b []float32) []byte {
	out := make([]byte, 12, 12+4*(len(a)+len(b)))
	binary.LittleEndian.PutUint32(out, uint32(m))
	binary.LittleEndian.PutUint32(out[4:], uint32(k))
	binary.LittleEndian.PutUint32(out[8:], uint32(n))
	for _, v := range append(append([]float32{}, a...), b...) {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
	}
	return out
}

func TestMatmulAgainstNaive(t *testing.T) {
	r := mustNew(t, Spec{Name: "matmul"})
	rng := rand.New(rand.NewPCG(3, 4))
	for _, d := range [][3]int{{1, 1, 1}, {2, 3, 4}, {17, 33, 9}, {64, 64, 64}} {
		m, k, n := d[0], d[1], d[2]
		a, b := make([]float32, m*k), make([]float32, k*n)
		for i := range a {
			a[i] = rng.Float32()*2 - 1
		}
		for i := range b {
			b[i] = rng.Float32()*2 - 1
		}
		out, err := r.Run(context.Background(), "mul", encMatmul(m, k, n, a, b))
		if err != nil {
			t.Fatal(err)
		}
		c := decodeF32(out)
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				var s float64
				for p := 0; p < k; p++ {
					s += float64(a[i*k+p]) * float64(b[p*n+j])
				}
				if math.Abs(float64(c[i*n+j])-s) > 1e-4*float64(k) {
					t.Fatalf("%v C[%d,%d]=%v want %v", d, i, j, c[i*n+j], s)
				}
			}
		}
	}
	if _, err := r.Run(context.Background(), "mul", encMatmul(2, 2, 2, []float32{1}, nil)); !errors.Is(err, ErrBadInput) {
		t.Fatalf("short matmul: %v", err)
	}
}

// A batch of tiny matmul items asking for large outputs (k = 0: 12 bytes in,
// m×n×4 bytes out) fails once its outputs pass the reply's budget, having
// computed no more than one item beyond it; within the budget it runs.
func TestRunBatchOutputBudget(t *testing.T) {
	ctx := context.Background()
	r := mustNew(t, Spec{Name: "matmul"})
	item := encMatmul(1024, 0, 1024, nil, nil) // 4 MiB of zeros out
	ins := make([][]byte, 64)                  // 256 MiB in all
	for i := range ins {
		ins[i] = item
	}
	if _, err := RunBatch(ctx, r, "mul", ins, 10<<20); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "items 0–2") {
		t.Fatalf("64 items of 4 MiB with a 10 MiB budget: %v, want ErrBadInput at item 2", err)
	}
	outs, err := RunBatch(ctx, r, "mul", ins[:2], 10<<20)
	if err != nil || len(outs) != 2 || len(outs[1]) != 4<<20 {
		t.Fatalf("2 items within the budget: %d outputs, %v", len(outs), err)
	}
	// The MCT role batches: its outputs are checked as a whole.
	rng := rand.New(rand.NewPCG(7, 8))
	rs := mct.Generate(rng, 10)
	cfg, _ := json.Marshal(rs)
	e, _ := mct.Compile(rs)
	qs, _ := e.EncodeAll(mct.GenerateQueries(rng, 2))
	b := mustNew(t, Spec{Name: "mct", Config: cfg})
	if _, err := RunBatch(ctx, b, "match", [][]byte{qs}, 1); !errors.Is(err, ErrBadInput) {
		t.Fatalf("MCT outputs above a 1-byte budget: %v", err)
	}
	if _, err := RunBatch(ctx, b, "match", [][]byte{qs}, 1<<20); err != nil {
		t.Fatalf("MCT outputs within the budget: %v", err)
	}
}

func TestBadInputs(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		spec  Spec
		entry string
		in    []byte
		want  error
	}{
		{Spec{Name: "fft"}, "forward", make([]byte, 16*3), ErrBadInput},
		{Spec{Name: "fft"}, "forward", make([]byte, 15), ErrBadInput},
		{Spec{Name: "fft"}, "sideways", make([]byte, 16), ErrUnknownEntry},
		{Spec{Name: "echo"}, "nope", nil, ErrUnknownEntry},
		{Spec{Name: "aesgcm", Config: make([]byte, 16)}, "seal", []byte("short"), ErrBadInput},
	} {
		r := mustNew(t, tc.spec)
		if _, err := r.Run(ctx, tc.entry, tc.in); !errors.Is(err, tc.want) {
			t.Errorf("%s/%s: %v, want %v", tc.spec.Name, tc.entry, err, tc.want)
		}
	}
	if _, err := New(ctx, Spec{Name: "gpu-magic"}); !errors.Is(err, ErrUnknownRole) {
		t.Errorf("unknown role: %v", err)
	}
	if _, err := New(ctx, Spec{Name: "mct", Config: []byte("{")}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("bad mct config: %v", err)
	}
}

func TestMCTRole(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rs := mct.Generate(rng, 300)
	cfg, _ := json.Marshal(rs)
	r := mustNew(t, Spec{Name: "mct", Config: cfg})
	e, _ := mct.Compile(rs)
	qs, _ := e.EncodeAll(mct.GenerateQueries(rng, 100))
	// Items of 1..4 queries through RunBatch agree with brute force.
	var ins [][]byte
	for off := 0; off < len(qs); {
		n := (1 + len(ins)%4) * mct.QuerySize
		if off+n > len(qs) {
			n = len(qs) - off
		}
		ins = append(ins, qs[off:off+n])
		off += n
	}
	outs, err := RunBatch(context.Background(), r, "match", ins, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, in := range ins {
		for j := 0; j < len(in)/mct.QuerySize; j++ {
			want, _, _ := e.BruteForce(in[j*mct.QuerySize:])
			if got := binary.LittleEndian.Uint32(outs[i][4*j:]); got != want {
				t.Fatalf("item %d query %d: %d want %d", i, j, got, want)
			}
		}
	}
	if _, err := r.Run(context.Background(), "match", make([]byte, 65)); !errors.Is(err, ErrBadInput) {
		t.Fatalf("ragged query: %v", err)
	}
}

func TestWasmRole(t *testing.T) {
	ctx := context.Background()
	r := mustNew(t, Spec{Name: "wasm", Module: wasmtest.EchoModule()})
	if got := r.Entries(); len(got) != 3 || got[0] != "echo" || got[1] != "spin" || got[2] != "upper" {
		t.Fatalf("entries %v", got)
	}
	for i := 0; i < 50; i++ { // the arena is reset between calls
		out, err := r.Run(ctx, "echo", bytes.Repeat([]byte{byte(i)}, 1000))
		if err != nil || len(out) != 1000 || out[0] != byte(i) {
			t.Fatalf("echo %d: %v", i, err)
		}
	}
	out, err := RunBatch(ctx, r, "upper", [][]byte{[]byte("hello, Wasm!"), []byte("abc")}, 0)
	if err != nil || string(out[0]) != "HELLO, WASM!" || string(out[1]) != "ABC" {
		t.Fatalf("upper: %q %v", out, err)
	}
	// Too big for the one-page memory (no growth by the module).
	if _, err := r.Run(ctx, "echo", make([]byte, 1<<17)); !errors.Is(err, ErrBadInput) {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := r.Run(ctx, "nope", nil); !errors.Is(err, ErrUnknownEntry) {
		t.Fatalf("unknown entry: %v", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := r.Run(tctx, "spin", nil); !errors.Is(err, ErrWasmTrap) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("spin: %v", err)
	}
	if out, err := r.Run(ctx, "echo", []byte("after")); err != nil || string(out) != "after" {
		t.Fatalf("after interruption: %q %v", out, err)
	}
}

func TestWasmMemoryLimit(t *testing.T) {
	ctx := context.Background()
	if _, err := New(ctx, Spec{Name: "wasm", Module: wasmtest.MemoryModule(300)}); !errors.Is(err, ErrBadModule) {
		t.Fatalf("300 pages over the default limit: %v", err)
	}
	r, err := New(ctx, Spec{Name: "wasm", Module: wasmtest.MemoryModule(300), WasmMemoryPages: 400})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	// 300 pages hold a 1 MiB input.
	if out, err := r.Run(ctx, "echo", make([]byte, 1<<20)); err != nil || len(out) != 1<<20 {
		t.Fatalf("1 MiB echo: %d %v", len(out), err)
	}
	if _, err := New(ctx, Spec{Name: "wasm", Module: wasmtest.EchoModule(), WasmMemoryPages: MaxWasmMemoryPages + 1}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("limit above the ceiling: %v", err)
	}
}

func TestWasmRejects(t *testing.T) {
	good := wasmtest.EchoModule()
	for _, tc := range []struct {
		name string
		mod  []byte
	}{
		{"empty", nil},
		{"garbage", []byte("not a wasm module")},
		{"truncated", good[:len(good)-5]},
		{"bad magic", append([]byte{1}, good[1:]...)},
		{"imports", wasmtest.ImportingModule()},
	} {
		if _, err := New(context.Background(), Spec{Name: "wasm", Module: tc.mod}); !errors.Is(err, ErrBadModule) {
			t.Errorf("%s: %v, want ErrBadModule", tc.name, err)
		}
	}
}

// A native role run item by item stops at the next item once its context
// ends (its caller gone, its lease ended).
func TestRunBatchCancellationPoint(t *testing.T) {
	r := mustNew(t, Spec{Name: "sha256"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RunBatch(ctx, r, "sum", [][]byte{[]byte("a"), []byte("b")}, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled batch: %v, want context.Canceled", err)
	}
}

// Each execution of a Wasm role (one Run, one RunBatch) starts from the
// module's initial memory: dump shows nothing an earlier execution wrote.
// Within a batch the items share the instance, in turn.
func TestWasmExecutionsStartFresh(t *testing.T) {
	ctx := context.Background()
	r := mustNew(t, Spec{Name: "wasm", Module: wasmtest.DumpModule()})
	secret := []byte("an earlier execution's input")
	zeros := make([]byte, wasmtest.DumpLen)
	for i := range 3 {
		if _, err := RunBatch(ctx, r, "echo", [][]byte{secret, secret}, 0); err != nil {
			t.Fatal(err)
		}
		if out, err := r.Run(ctx, "dump", nil); err != nil || !bytes.Equal(out, zeros) {
			t.Fatalf("round %d: Run dump after a batch: %q %v", i, out, err)
		}
		if _, err := r.Run(ctx, "echo", secret); err != nil {
			t.Fatal(err)
		}
		outs, err := RunBatch(ctx, r, "dump", [][]byte{nil}, 0)
		if err != nil || !bytes.Equal(outs[0], zeros) {
			t.Fatalf("round %d: RunBatch dump after a Run: %q %v", i, outs, err)
		}
	}
}
