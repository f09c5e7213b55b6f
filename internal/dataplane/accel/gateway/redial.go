package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/pki"
)

// Redialer is a Backend for one slot that dials on first use and again
// after its connection fails (an appliance restart, a lease renewed with a
// new credential), so a gateway outlives its slots' connections. The call
// that sees the failure still fails; the next one redials. Safe for
// concurrent use; Close closes the current connection.
type Redialer struct {
	Addr       string
	Credential []byte
	// TLS, if set, returns the client configuration for a slot that
	// requires TLS (see accel.WithTLS); it is called at each dial, so that
	// the CA certificates it trusts may change while the gateway runs.
	TLS func() *tls.Config
	// Track, if set, is handed each TLS connection to the slot
	// (accel.WithTrack): a revocation list's Tracker ends it when a list
	// it takes later revokes the slot's certificate, or the CA
	// certificates it holds no longer hold the slot's CA. The call under
	// way fails (accel.ErrClosed wrapping why) and the next one redials,
	// whose handshake checks the list of then.
	Track pki.TrackFunc
	// Settle bounds how long a call whose context ended waits for the slot
	// to end the cancelled execution (0: DefaultSettle); see CallBatch.
	Settle time.Duration

	mu sync.Mutex
	c  *accel.Conn
}

// NewRedialer returns a Redialer for addr.
func NewRedialer(addr string, credential []byte) *Redialer {
	return &Redialer{Addr: addr, Credential: append([]byte(nil), credential...)}
}

func (r *Redialer) conn(ctx context.Context) (*accel.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c != nil {
		return r.c, nil
	}
	var tc *tls.Config
	if r.TLS != nil {
		tc = r.TLS()
	}
	c, err := accel.Dial(ctx, r.Addr, r.Credential, accel.WithTLS(tc), accel.WithTrack(r.Track))
	if err != nil {
		return nil, err
	}
	r.c = c
	return c, nil
}

func (r *Redialer) drop(c *accel.Conn) {
	r.mu.Lock()
	if r.c == c {
		r.c = nil
	}
	r.mu.Unlock()
	_ = c.Close()
}

// DefaultSettle bounds how long a cancelled call waits for its slot to
// end the execution (Redialer.Settle).
const DefaultSettle = 2 * time.Second

// CallBatch implements Backend. A call whose context ends (every caller of
// the batch gone, the slot taken out) cancels the execution on the slot and
// returns once the slot has ended it (for at most Settle): a role with no
// cancellation point (a native batch kernel such as MCT) runs the batch to
// its end, and the gateway must not count the slot free, and dispatch
// another batch to it, while it does.
func (r *Redialer) CallBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	c, err := r.conn(ctx)
	if err != nil {
		return nil, err
	}
	settle := r.Settle
	if settle <= 0 {
		settle = DefaultSettle
	}
	outs, err := c.CallBatchSettled(ctx, entry, ins, settle)
	if errors.Is(err, accel.ErrClosed) {
		r.drop(c)
	}
	return outs, err
}

// Close closes the current connection, if any.
func (r *Redialer) Close() error {
	r.mu.Lock()
	c := r.c
	r.c = nil
	r.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.Close()
}
