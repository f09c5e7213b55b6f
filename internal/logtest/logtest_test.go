package logtest

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestBufferConcurrent: writes from many goroutines while another reads
// arrive whole (run with -race: the buffer is shared unguarded otherwise).
func TestBufferConcurrent(t *testing.T) {
	log, b := Logger(nil)
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				log.Info("line", "writer", w, "i", i)
			}
		})
	}
	wg.Go(func() {
		for range each {
			_ = b.Lines("level=INFO")
		}
	})
	wg.Wait()
	lines := b.Lines("")
	if len(lines) != writers*each {
		t.Fatalf("%d lines, want %d", len(lines), writers*each)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "time=") || !strings.Contains(l, `msg=line writer=`) {
			t.Fatalf("a line not whole: %q", l)
		}
	}
}

func TestBufferLines(t *testing.T) {
	var b Buffer
	fmt.Fprint(&b, "level=INFO a\nlevel=ERROR b\nlevel=ERROR c\npartial ERROR")
	for _, c := range []struct {
		sub  string
		want []string
	}{
		{"ERROR", []string{"level=ERROR b", "level=ERROR c", "partial ERROR"}},
		{"level=INFO", []string{"level=INFO a"}},
		{"WARN", nil},
		{"", []string{"level=INFO a", "level=ERROR b", "level=ERROR c", "partial ERROR"}},
	} {
		if got := b.Lines(c.sub); !slices.Equal(got, c.want) {
			t.Errorf("Lines(%q) = %q, want %q", c.sub, got, c.want)
		}
	}
	log, lb := Logger(&slog.HandlerOptions{Level: slog.LevelDebug})
	log.Debug("shown")
	if !strings.Contains(lb.String(), "level=DEBUG msg=shown") {
		t.Fatalf("Logger at DEBUG: %q", lb.String())
	}
	log, lb = Logger(nil)
	log.Debug("hidden")
	if lb.String() != "" {
		t.Fatalf("Logger(nil) logged DEBUG: %q", lb.String())
	}
}
