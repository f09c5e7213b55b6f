package logtest

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writes and reads: a log's
// destination (slog's handlers write from the goroutines that log), or a
// process's output, that a test reads while it runs.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Lines returns the lines written so far that contain sub (every line
// for ""), without their newlines; a last line not ended yet counts.
func (b *Buffer) Lines(sub string) []string {
	var out []string
	for line := range strings.Lines(b.String()) {
		if line = strings.TrimSuffix(line, "\n"); strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return out
}

// Logger returns a logger writing text lines (slog.TextHandler, with
// opts: nil logs at INFO and above) to a new Buffer, and that Buffer.
func Logger(opts *slog.HandlerOptions) (*slog.Logger, *Buffer) {
	b := new(Buffer)
	return slog.New(slog.NewTextHandler(b, opts)), b
}
