package nbd

import (
	"fmt"
	"sync"
)

// MemBackend is an in-memory Backend (for tests and for RAM-backed exports).
// It implements Trimmer and Zeroer. Flush is a no-op: memory is as durable as
// it gets.
type MemBackend struct {
	mu   sync.RWMutex
	data []byte
}

// NewMemBackend returns a zero-filled backend of size bytes.
func NewMemBackend(size int64) *MemBackend {
	return &MemBackend{data: make([]byte, size)}
}

// Size implements Backend.
func (m *MemBackend) Size() int64 { return int64(len(m.data)) }

// Bytes returns the backing slice (not a copy).
func (m *MemBackend) Bytes() []byte { return m.data }

func (m *MemBackend) check(off, n int64) error {
	// Without off+n, which wraps around near the int64 maximum.
	if size := int64(len(m.data)); off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("nbd: range [%d,+%d) outside [0,%d)", off, n, len(m.data))
	}
	return nil
}

// ReadAt implements io.ReaderAt.
func (m *MemBackend) ReadAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	m.mu.RLock()
	copy(p, m.data[off:])
	m.mu.RUnlock()
	return len(p), nil
}

// WriteAt implements io.WriterAt.
func (m *MemBackend) WriteAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	m.mu.Lock()
	copy(m.data[off:], p)
	m.mu.Unlock()
	return len(p), nil
}

// Flush implements Backend.
func (m *MemBackend) Flush() error { return nil }

// Trim implements Trimmer (the range reads back as zeroes).
func (m *MemBackend) Trim(off, n int64) error { return m.WriteZeroes(off, n, false) }

// WriteZeroes implements Zeroer.
func (m *MemBackend) WriteZeroes(off, n int64, _ bool) error {
	if err := m.check(off, n); err != nil {
		return err
	}
	m.mu.Lock()
	clear(m.data[off : off+n])
	m.mu.Unlock()
	return nil
}
