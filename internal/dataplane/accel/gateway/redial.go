package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// Redialer is a Backend for one slot that dials on first use and again
// after its connection fails (an appliance restart, a lease renewed with a
// new credential), so a gateway outlives its slots' connections. The call
// that sees the failure still fails; the next one redials. Safe for
// concurrent use; Close closes the current connection.
type Redialer struct {
	Addr       string
	Credential []byte
	// TLS, if set, is the client configuration for a slot that requires
	// TLS (see accel.WithTLS).
	TLS *tls.Config

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
	c, err := accel.Dial(ctx, r.Addr, r.Credential, accel.WithTLS(r.TLS))
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

// CallBatch implements Backend.
func (r *Redialer) CallBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	c, err := r.conn(ctx)
	if err != nil {
		return nil, err
	}
	outs, err := c.CallBatch(ctx, entry, ins)
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
