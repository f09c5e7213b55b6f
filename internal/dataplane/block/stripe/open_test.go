package stripe

import (
	"bytes"
	"context"
	"errors"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// Open reads and writes the volume `rialto attach` serves, with the same
// layout: bytes written through an attachment are read back through Open
// and the other way round, for one part and for three.
func TestOpenSharesAttachLayout(t *testing.T) {
	for _, parts := range []int{1, 3} {
		var uris []string
		for range parts {
			uris = append(uris, startLender(t, 1<<20).uri)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		att := attach(t, AttachConfig{URIs: uris, StripeUnit: 64 << 10})
		nc, err := nbd.DialURI(ctx, att.URI())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		for _, conns := range []int{1, 2} {
			vol, err := Open(ctx, OpenConfig{URIs: uris, StripeUnit: 64 << 10, ConnsPerPart: conns})
			if err != nil {
				t.Fatal(err)
			}
			if vol.Size() != att.Volume().Size() {
				t.Fatalf("%d parts: Open sees %d bytes, the attachment %d", parts, vol.Size(), att.Volume().Size())
			}
			want := make([]byte, 300<<10+17)
			for i := range want {
				want[i] = byte(mrand.Uint32())
			}
			if _, err := nc.WriteAtContext(ctx, want, 100<<10+3, true); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(want))
			if _, err := vol.ReadAt(got, 100<<10+3); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%d parts, %d conns: Open reads other bytes than were written through the attachment (%v)", parts, conns, err)
			}
			if _, err := vol.WriteAt(want[:5000], 1<<19); err != nil {
				t.Fatal(err)
			}
			if err := vol.Flush(); err != nil {
				t.Fatal(err)
			}
			if _, err := nc.ReadAtContext(ctx, got[:5000], 1<<19); err != nil || !bytes.Equal(got[:5000], want[:5000]) {
				t.Fatalf("%d parts: the attachment reads other bytes than Open wrote (%v)", parts, err)
			}
			vol.Close()
		}
	}
}

func TestOpenErrors(t *testing.T) {
	l := startLender(t, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	refused := errors.New("refused by the check")
	for _, tc := range []struct {
		name string
		cfg  OpenConfig
		want error
	}{
		{"no parts", OpenConfig{}, ErrConfig},
		{"malformed URI", OpenConfig{URIs: []string{"nbd://[::1/" + l.name}}, ErrConfig},
		{"bad stripe unit", OpenConfig{URIs: []string{l.uri, l.uri}, StripeUnit: 1000}, ErrConfig},
		{"check refuses", OpenConfig{URIs: []string{l.uri}, Check: func(context.Context, int, nbd.URI) (nbd.URI, error) { return nbd.URI{}, refused }}, refused},
		{"wrong export", OpenConfig{URIs: []string{nbd.URI{Network: "tcp", Address: l.ln.Addr().String(), Export: "nope"}.String()}}, nil},
	} {
		vol, err := Open(ctx, tc.cfg)
		if err == nil {
			vol.Close()
			t.Errorf("%s: opened", tc.name)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if bytes.Contains([]byte(err.Error()), []byte(l.name)) {
			t.Errorf("%s: error quotes the export name: %v", tc.name, err)
		}
	}
}
