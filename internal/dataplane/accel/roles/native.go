package roles

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"math"
	"math/bits"
)

// echoRole returns its input: it measures invocation overhead.
type echoRole struct{}

func (echoRole) Name() string                { return "echo" }
func (echoRole) Entries() []string           { return []string{"echo"} }
func (echoRole) Close(context.Context) error { return nil }
func (echoRole) Run(_ context.Context, entry string, in []byte) ([]byte, error) {
	if entry != "echo" {
		return nil, fmt.Errorf("%w %q for echo", ErrUnknownEntry, entry)
	}
	return append([]byte(nil), in...), nil
}

// RunBatch copies every input into one allocation.
func (echoRole) RunBatch(_ context.Context, entry string, ins [][]byte) ([][]byte, error) {
	if entry != "echo" {
		return nil, fmt.Errorf("%w %q for echo", ErrUnknownEntry, entry)
	}
	n := 0
	for _, in := range ins {
		n += len(in)
	}
	buf := make([]byte, 0, n)
	outs := make([][]byte, len(ins))
	for i, in := range ins {
		buf = append(buf, in...)
		outs[i] = buf[len(buf)-len(in) : len(buf) : len(buf)]
	}
	return outs, nil
}

// shaRole hashes its input with SHA-256 (entry "sum", 32-byte output).
type shaRole struct{}

func (shaRole) Name() string                { return "sha256" }
func (shaRole) Entries() []string           { return []string{"sum"} }
func (shaRole) Close(context.Context) error { return nil }
func (shaRole) Run(_ context.Context, entry string, in []byte) ([]byte, error) {
	if entry != "sum" {
		return nil, fmt.Errorf("%w %q for sha256", ErrUnknownEntry, entry)
	}
	s := sha256.Sum256(in)
	return s[:], nil
}

// NewStream implements Streamer: SHA-256 hashes its input in order, piece
// by piece.
func (shaRole) NewStream(entry string) Stream {
	if entry != "sum" {
		return nil
	}
	return shaStream{sha256.New()}
}

type shaStream struct{ h hash.Hash }

func (s shaStream) Write(p []byte) (int, error) { return s.h.Write(p) }
func (s shaStream) Sum() []byte                 { return s.h.Sum(nil) }

// aesRole seals and opens with AES-GCM under the key given as Config
// (16, 24 or 32 bytes). Input: 12-byte nonce followed by the plaintext
// ("seal") or the ciphertext with its tag ("open").
type aesRole struct{ aead cipher.AEAD }

func newAESGCM(_ context.Context, s Spec) (Role, error) {
	b, err := aes.NewCipher(s.Config)
	if err != nil {
		return nil, fmt.Errorf("%w: aesgcm key: %v", ErrBadConfig, err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		return nil, fmt.Errorf("%w: aesgcm: %v", ErrBadConfig, err)
	}
	return &aesRole{aead: g}, nil
}

func (*aesRole) Name() string                { return "aesgcm" }
func (*aesRole) Entries() []string           { return []string{"seal", "open"} }
func (*aesRole) Close(context.Context) error { return nil }
func (r *aesRole) Run(_ context.Context, entry string, in []byte) ([]byte, error) {
	ns := r.aead.NonceSize()
	if len(in) < ns {
		return nil, fmt.Errorf("%w: aesgcm input shorter than the %d-byte nonce", ErrBadInput, ns)
	}
	nonce, body := in[:ns], in[ns:]
	switch entry {
	case "seal":
		return r.aead.Seal(nil, nonce, body, nil), nil
	case "open":
		out, err := r.aead.Open(nil, nonce, body, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: aesgcm open: %v", ErrBadInput, err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w %q for aesgcm", ErrUnknownEntry, entry)
}

// matmulRole multiplies float32 matrices (entry "mul"). Input: little-endian
// uint32 m, k, n, then A (m×k) and B (k×n) row-major float32; output C (m×n).
type matmulRole struct{}

// MaxMatmulElems bounds m×k, k×n and m×n for one invocation.
const MaxMatmulElems = 1 << 24

func (matmulRole) Name() string                { return "matmul" }
func (matmulRole) Entries() []string           { return []string{"mul"} }
func (matmulRole) Close(context.Context) error { return nil }
func (matmulRole) Run(_ context.Context, entry string, in []byte) ([]byte, error) {
	if entry != "mul" {
		return nil, fmt.Errorf("%w %q for matmul", ErrUnknownEntry, entry)
	}
	if len(in) < 12 {
		return nil, fmt.Errorf("%w: matmul header is 12 bytes", ErrBadInput)
	}
	m := uint64(binary.LittleEndian.Uint32(in))
	k := uint64(binary.LittleEndian.Uint32(in[4:]))
	n := uint64(binary.LittleEndian.Uint32(in[8:]))
	if m*k > MaxMatmulElems || k*n > MaxMatmulElems || m*n > MaxMatmulElems {
		return nil, fmt.Errorf("%w: matmul %dx%dx%d too large", ErrBadInput, m, k, n)
	}
	if want := 12 + 4*(m*k+k*n); uint64(len(in)) != want {
		return nil, fmt.Errorf("%w: matmul %dx%dx%d wants %d bytes, got %d", ErrBadInput, m, k, n, want, len(in))
	}
	a := decodeF32(in[12 : 12+4*m*k])
	b := decodeF32(in[12+4*m*k:])
	c := MatMul(a, b, int(m), int(k), int(n))
	out := make([]byte, 4*len(c))
	for i, v := range c {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out, nil
}

func decodeF32(p []byte) []float32 {
	v := make([]float32, len(p)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
	}
	return v
}

// MatMul returns A·B for row-major A (m×k) and B (k×n), accumulating in
// float32 in i-p-j order (cache friendly, vectorisable).
func MatMul(a, b []float32, m, k, n int) []float32 {
	c := make([]float32, m*n)
	if len(c) == 0 {
		// Nothing to compute, however many rows of nothing: a matmul
		// of 2³²−1 rows of no column is 12 bytes of input.
		return c
	}
	for i := 0; i < m; i++ {
		ci := c[i*n : (i+1)*n]
		for p := 0; p < k; p++ {
			aip := a[i*k+p]
			bp := b[p*n : (p+1)*n]
			for j := range ci {
				ci[j] += aip * bp[j]
			}
		}
	}
	return c
}

// fftRole computes a complex128 FFT of a power-of-two length (entries
// "forward" and "inverse", the inverse scaled by 1/n). Input and output are
// n pairs of little-endian float64 (real, imaginary).
type fftRole struct{}

// MaxFFTSize bounds the transform length.
const MaxFFTSize = 1 << 22

func (fftRole) Name() string                { return "fft" }
func (fftRole) Entries() []string           { return []string{"forward", "inverse"} }
func (fftRole) Close(context.Context) error { return nil }
func (fftRole) Run(_ context.Context, entry string, in []byte) ([]byte, error) {
	var inverse bool
	switch entry {
	case "forward":
	case "inverse":
		inverse = true
	default:
		return nil, fmt.Errorf("%w %q for fft", ErrUnknownEntry, entry)
	}
	if len(in)%16 != 0 {
		return nil, fmt.Errorf("%w: fft input must be complex128 pairs (16 bytes each), got %d bytes", ErrBadInput, len(in))
	}
	n := len(in) / 16
	if n == 0 || n&(n-1) != 0 || n > MaxFFTSize {
		return nil, fmt.Errorf("%w: fft length %d is not a power of two in [1, %d]", ErrBadInput, n, MaxFFTSize)
	}
	x := DecodeComplex(in)
	FFT(x, inverse)
	return EncodeComplex(x), nil
}

// DecodeComplex decodes little-endian (re, im) float64 pairs.
func DecodeComplex(p []byte) []complex128 {
	x := make([]complex128, len(p)/16)
	for i := range x {
		re := math.Float64frombits(binary.LittleEndian.Uint64(p[16*i:]))
		im := math.Float64frombits(binary.LittleEndian.Uint64(p[16*i+8:]))
		x[i] = complex(re, im)
	}
	return x
}

// EncodeComplex is the inverse of DecodeComplex.
func EncodeComplex(x []complex128) []byte {
	p := make([]byte, 16*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint64(p[16*i:], math.Float64bits(real(v)))
		binary.LittleEndian.PutUint64(p[16*i+8:], math.Float64bits(imag(v)))
	}
	return p
}

// FFT transforms x in place (iterative radix-2 Cooley–Tukey); len(x) must be
// a power of two. The inverse transform is scaled by 1/len(x).
func FFT(x []complex128, inverse bool) {
	n := len(x)
	if n <= 1 {
		return
	}
	shift := 64 - uint(bits.Len(uint(n))-1)
	for i := range x {
		j := int(bits.Reverse64(uint64(i)) >> shift)
		if i < j {
			x[i], x[j] = x[j], x[i]
		}
	}
	sign := -1.0
	if inverse {
		sign = 1
	}
	for size := 2; size <= n; size <<= 1 {
		half := size / 2
		step := sign * 2 * math.Pi / float64(size)
		for k := 0; k < half; k++ {
			s, c := math.Sincos(step * float64(k))
			w := complex(c, s)
			for start := k; start < n; start += size {
				u := x[start]
				t := w * x[start+half]
				x[start] = u + t
				x[start+half] = u - t
			}
		}
	}
	if inverse {
		inv := complex(1/float64(n), 0)
		for i := range x {
			x[i] *= inv
		}
	}
}
