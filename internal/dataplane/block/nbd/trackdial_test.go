package nbd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// TestTLSTrackEndedDuringDial: a revocation list may end a connection
// WithTrack registered before Dial has returned it (a list another
// goroutine took just then). Dial then fails with ErrClosed, wrapping
// why, rather than hand out a dead client with a nil error; a list taken
// concurrently with Dial's last steps races with nothing (run with
// -race: Dial once wrote the function that unregisters the connection
// unguarded while the list's ending read it).
func TestTLSTrackEndedDuringDial(t *testing.T) {
	p := newTestPKI(t)
	be := NewMemBackend(1 << 20)
	_, addr := startTLSServer(t, p.server, false, Export{Name: testName, Backend: be})
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.ca.Pool()}
	dialWith := func(track pki.TrackFunc) (*Client, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return Dial(ctx, "tcp", addr, testName, WithTLS(cfg), WithTrack(track))
	}

	t.Run("revoked before Dial returns", func(t *testing.T) {
		crl := pki.NewCRL([]*x509.Certificate{p.ca.Certificate()})
		if _, err := crl.Update(p.ca.CRLPEM()); err != nil {
			t.Fatal(err)
		}
		track := crl.Tracker(nil)
		// The list revoking the server is taken once the connection
		// is registered, before Dial goes on.
		c, err := dialWith(func(peer string, cs tls.ConnectionState, end func(error)) (func(), error) {
			untrack, err := track(peer, cs, end)
			if err != nil {
				return nil, err
			}
			if err := p.ca.Revoke(cs.PeerCertificates[0].SerialNumber); err != nil {
				t.Error(err)
			}
			if took, err := crl.Update(p.ca.CRLPEM()); err != nil || !took {
				t.Errorf("Update: %v, %v", took, err)
			}
			return untrack, nil
		})
		if err == nil {
			_, rerr := c.ReadAt(make([]byte, 1), 0)
			c.Close()
			t.Fatalf("Dial returned a client with a nil error though the list ended its connection (a read: %v)", rerr)
		}
		if !errors.Is(err, ErrClosed) || !errors.Is(err, pki.ErrRevoked) {
			t.Fatalf("Dial: %v, want %v wrapping %v", err, ErrClosed, pki.ErrRevoked)
		}
	})

	t.Run("CA dropped racing Dial", func(t *testing.T) {
		other, err := pki.Open(filepath.Join(t.TempDir(), "other"), pki.Options{})
		if err != nil {
			t.Fatal(err)
		}
		both := []*x509.Certificate{p.ca.Certificate(), other.Certificate()}
		alone := []*x509.Certificate{other.Certificate()}
		crl := pki.NewCRL(both)
		track := crl.Tracker(nil)
		var early, late int
		for i := range 200 {
			crl.SetRoots(both)
			done := make(chan struct{})
			// Once the connection is registered, another goroutine
			// drops the server's CA while Dial goes on.
			c, err := dialWith(func(peer string, cs tls.ConnectionState, end func(error)) (func(), error) {
				untrack, err := track(peer, cs, end)
				if err != nil {
					close(done)
					return nil, err
				}
				go func() {
					defer close(done)
					crl.SetRoots(alone)
				}()
				// Let it run: most often it ends the connection
				// before Dial goes on. (A yield orders nothing
				// for the race detector.)
				runtime.Gosched()
				return untrack, nil
			})
			<-done
			if err != nil {
				if !errors.Is(err, ErrClosed) || !errors.Is(err, pki.ErrUntrusted) {
					t.Fatalf("dial %d: %v, want %v wrapping %v", i, err, ErrClosed, pki.ErrUntrusted)
				}
				early++
				continue
			}
			// Ended once Dial returned it: its requests say why.
			_, err = c.ReadAt(make([]byte, 1), 0)
			c.Close()
			if !errors.Is(err, ErrClosed) || !errors.Is(err, pki.ErrUntrusted) {
				t.Fatalf("dial %d: a read once the CA was dropped: %v, want %v wrapping %v", i, err, ErrClosed, pki.ErrUntrusted)
			}
			late++
		}
		t.Logf("ended before Dial returned: %d, after: %d", early, late)
	})
}
