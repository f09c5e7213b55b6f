package borrower

import (
	"context"
	"crypto/tls"
	"fmt"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// AccelSlot is one target of an accelerator lease: a slot of a dedicated
// lease, or, for a shared lease, its lender's batching gateway (which
// chooses the slot per request). Both speak the accelerator protocol.
type AccelSlot struct {
	Address    string
	Credential string // a secret: never log it
	Gateway    string // the gateway's role for a shared lease; "" for a slot
	TLS        bool   // the target requires TLS (a rialto-accels:// URI)
}

// Shared reports whether the target is a shared lease's gateway.
func (s AccelSlot) Shared() bool { return s.Gateway != "" }

// AccelSlots returns the targets of accelerator lease l in slot order: a
// dedicated lease's slots (its parts' URIs, each naming one or more), or a
// shared lease's gateway.
func AccelSlots(l api.Lease) ([]AccelSlot, error) {
	var uris []accel.URI
	for _, p := range l.Parts {
		if p.URI != "" {
			u, err := accel.ParseURI(p.URI)
			if err != nil {
				return nil, fmt.Errorf("lease %s: %w", l.ID, err)
			}
			uris = append(uris, u)
		}
	}
	if len(uris) == 0 {
		u, err := accel.ParseURI(l.URI)
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", l.ID, err)
		}
		uris = append(uris, u)
	}
	var slots []AccelSlot
	for _, u := range uris {
		for _, a := range u.Slots {
			slots = append(slots, AccelSlot{Address: a, Credential: u.Credential, Gateway: u.Gateway, TLS: u.TLS})
		}
	}
	return slots, nil
}

// DialAccel connects to target s and authenticates with its credential;
// the returned connection's Info says which role the slot runs. A target
// that requires TLS is dialled with tlsCfg (as AttachConfig.TLS; nil
// trusts the system's CAs). opts are more of accel.Dial's: accel.WithTrack
// (the Tracker of the revocation list tlsCfg checks lenders with) ends
// the connection once a list taken later revokes the lender's
// certificate.
func DialAccel(ctx context.Context, s AccelSlot, tlsCfg *tls.Config, opts ...accel.DialOption) (*accel.Conn, error) {
	if !s.TLS {
		return accel.Dial(ctx, s.Address, []byte(s.Credential))
	}
	if tlsCfg == nil {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return accel.Dial(ctx, s.Address, []byte(s.Credential), append([]accel.DialOption{accel.WithTLS(tlsCfg)}, opts...)...)
}
