package accept

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"syscall"
	"time"
)

// The waits after consecutive failed accepts: MinWait, doubling up to
// MaxWait.
const (
	MinWait = 5 * time.Millisecond
	MaxWait = time.Second
)

// Backoff is an accept loop's wait after a failed accept.
type Backoff struct {
	delay time.Duration // the last wait; 0 after a successful accept
}

// Retry is for an accept that failed with err. When err may not repeat
// (Transient), it logs a warning (log may be nil), waits (MinWait,
// doubling up to MaxWait over consecutive failures) or until ctx ends,
// and reports whether to accept again: ctx is still live. Any other
// error (the listener closed) is false at once.
func (b *Backoff) Retry(ctx context.Context, err error, log *slog.Logger) bool {
	if ctx.Err() != nil || !Transient(err) {
		return false
	}
	b.delay = min(max(2*b.delay, MinWait), MaxWait)
	if log != nil {
		log.Warn("accept failed; retrying", "err", err, "in", b.delay)
	}
	t := time.NewTimer(b.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Reset is for a successful accept: the next failure waits MinWait.
func (b *Backoff) Reset() { b.delay = 0 }

// Transient reports whether an accept's err may not repeat: a timeout, or
// a shortage of descriptors or memory.
func Transient(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}
