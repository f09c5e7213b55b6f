package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestAdopt: two copies of a CA directory adopting one shared revocation
// list sign the same entries with the same number, which a reader taking
// the higher number takes from either, and refuse the certificates it
// names. A copy whose own list revokes what the shared one does not, or
// has a higher number, says so (Missing, MinNumber; both when both) and
// is left as it is; adopting the list it holds changes nothing; IssuedTo lists a
// holder's certificates without revoking them.
func TestAdopt(t *testing.T) {
	clk := newClock()
	a, b := caAndCopy(t, clk)
	iss, err := a.Issue(Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := a.IssuedTo("node-a"); err != nil || len(got) != 1 || got[0].Cmp(iss.Cert.SerialNumber) != 0 {
		t.Fatalf("IssuedTo: %v %v", got, err)
	}
	if err := a.Verify(iss.Cert, ClientAuth); err != nil {
		t.Fatalf("IssuedTo revoked it: %v", err)
	}
	// B revokes a serial of its own, in its directory only (number 2).
	local := big.NewInt(0x77)
	if err := b.Revoke(local); err != nil {
		t.Fatal(err)
	}
	at := clk.Now().UTC().Truncate(time.Second)
	shared := SharedList{Number: big.NewInt(5), Revoked: map[string]time.Time{iss.Cert.SerialNumber.Text(16): at}}
	ad, err := b.Adopt(shared)
	if err != nil || len(ad.Missing) != 1 || ad.Missing[0].Cmp(local) != 0 || ad.Changed {
		t.Fatalf("adopting a list without B's own revocation: %+v %v", ad, err)
	}
	// Numbered as B's list: B's revocation must go into it with a number
	// above B's, at once.
	if ad, err := b.Adopt(SharedList{Number: big.NewInt(2), Revoked: shared.Revoked}); err != nil || len(ad.Missing) != 1 || ad.MinNumber == nil || ad.MinNumber.Int64() != 3 || ad.Changed {
		t.Fatalf("adopting a list numbered as B's, without B's own revocation: %+v %v", ad, err)
	}
	shared.Revoked[local.Text(16)] = at
	// A's list is numbered 1 (as created): a list as high with other
	// entries needs a higher number.
	if ad, err := a.Adopt(SharedList{Number: big.NewInt(1), Revoked: shared.Revoked}); err != nil || ad.MinNumber == nil || ad.MinNumber.Int64() != 2 || ad.Changed {
		t.Fatalf("adopting a list numbered as A's: %+v %v", ad, err)
	}
	for _, ca := range []*CA{a, b} {
		ad, err := ca.Adopt(shared)
		if err != nil || !ad.Changed {
			t.Fatalf("adopting the shared list: %+v %v", ad, err)
		}
		if n := ca.CRLNumber(); n.Cmp(shared.Number) != 0 {
			t.Fatalf("adopted, numbered %v, want %v", n, shared.Number)
		}
		if err := ca.Verify(iss.Cert, ClientAuth); !errors.Is(err, ErrRevoked) {
			t.Fatalf("the shared list's certificate: %v", err)
		}
		again, err := openCA(t, ca.Dir(), clk).Adopt(shared)
		if err != nil || again.Changed || again.Missing != nil || again.MinNumber != nil {
			t.Fatalf("adopting it again: %+v %v", again, err)
		}
	}
	// A reader holding one copy's list takes nothing from the other.
	r := NewCRL([]*x509.Certificate{a.Certificate()})
	if ok, err := r.Update(a.CRLPEM()); !ok || err != nil {
		t.Fatalf("a reader takes A's list: %v %v", ok, err)
	}
	if ok, err := r.Update(b.CRLPEM()); ok || err != nil {
		t.Fatalf("a reader holding A's list took B's: %v %v", ok, err)
	}
	// A lower number for the same entries: above the directory's number
	// first (TestAdoptRaiseRacingRevocation).
	if ad, err := a.Adopt(SharedList{Number: big.NewInt(3), Revoked: shared.Revoked}); err != nil || ad.MinNumber == nil || ad.MinNumber.Int64() != 6 {
		t.Fatalf("adopting a lower number: %+v %v", ad, err)
	}
}

// TestUnreadableCRLKeepsRevocations: a ca-crl.pem that cannot be read
// back (a list another CA signed, as a copy of the directory rotated
// elsewhere writes it; a truncated copy) is an error for Adopt,
// ReloadIfChanged and Revoke, and the list the CA held stays in force:
// the certificates it revoked are still refused, under the same number.
// Before, the failed re-read had emptied the list in memory first, and
// the CA accepted every certificate it had revoked.
func TestUnreadableCRLKeepsRevocations(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	ca := openCA(t, dir, clk)
	other := openCA(t, t.TempDir(), clk)
	iss, err := ca.Issue(Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Revoke(iss.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	num := ca.CRLNumber()
	good, err := os.ReadFile(filepath.Join(dir, CRLFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		b    []byte
	}{
		{"signed by another CA", other.CRLPEM()},
		{"truncated", good[:len(good)/2]},
	} {
		if err := os.WriteFile(filepath.Join(dir, CRLFile), c.b, 0o644); err != nil {
			t.Fatal(err)
		}
		shared := SharedList{Number: big.NewInt(num.Int64() + 5), Revoked: map[string]time.Time{}}
		if ad, err := ca.Adopt(shared); err == nil {
			t.Fatalf("%s: Adopt: %+v, want an error", c.what, ad)
		}
		if _, err := ca.ReloadIfChanged(); err == nil {
			t.Fatalf("%s: ReloadIfChanged: no error", c.what)
		}
		if err := ca.Revoke(big.NewInt(0x99)); err == nil {
			t.Fatalf("%s: Revoke: no error", c.what)
		}
		if err := ca.Verify(iss.Cert, ClientAuth); !errors.Is(err, ErrRevoked) {
			t.Fatalf("%s: the revoked certificate after the failed re-reads: %v, want %v", c.what, err, ErrRevoked)
		}
		if err := ca.VerifyPeer(tls.ConnectionState{PeerCertificates: []*x509.Certificate{iss.Cert}}); !errors.Is(err, ErrRevoked) {
			t.Fatalf("%s: VerifyPeer after the failed re-reads: %v", c.what, err)
		}
		if n := ca.CRLNumber(); n.Cmp(num) != 0 {
			t.Fatalf("%s: number %v, want %v", c.what, n, num)
		}
	}
	// The list written back is read again.
	if err := os.WriteFile(filepath.Join(dir, CRLFile), good, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.ReloadIfChanged(); err != nil {
		t.Fatal(err)
	}
	if err := ca.Verify(iss.Cert, ClientAuth); !errors.Is(err, ErrRevoked) {
		t.Fatalf("re-read: %v", err)
	}
}

// TestAdoptRaiseRacingRevocation: a copy of the CA directory whose list
// has the shared list's entries under a higher number M asks for the
// shared number to be raised; another copy's revocation may land in the
// shared list between that answer and the raise. Two different lists
// must never be signed with one number (a reader holding one would never
// take the other): the raise asked for is above M, so the shared list
// raised after the revocation is not signed as M. Before, MinNumber was M
// itself, and the other copy signed the list with the revocation as M
// while this copy held the list without it as M.
func TestAdoptRaiseRacingRevocation(t *testing.T) {
	clk := newClock()
	a, b := caAndCopy(t, clk)
	at := clk.Now().UTC().Truncate(time.Second)
	// A holds the shared entries (none) as 5; the shared list is at 3.
	if ad, err := a.Adopt(SharedList{Number: big.NewInt(5), Revoked: map[string]time.Time{}}); err != nil || !ad.Changed {
		t.Fatalf("A adopting 5: %+v %v", ad, err)
	}
	shared := SharedList{Number: big.NewInt(3), Revoked: map[string]time.Time{}}
	ad, err := a.Adopt(shared)
	if err != nil || ad.MinNumber == nil {
		t.Fatalf("A adopting a lower number with the same entries: %+v %v", ad, err)
	}
	// Another replica revokes through the shared list (its number raised
	// by one), before A's raise lands.
	shared.Revoked["abc"] = at
	shared.Number = big.NewInt(4)
	if shared.Number.Cmp(ad.MinNumber) < 0 {
		shared.Number = new(big.Int).Set(ad.MinNumber)
	}
	if ad, err := b.Adopt(shared); err != nil || !ad.Changed {
		t.Fatalf("B adopting the raised list: %+v %v", ad, err)
	}
	if b.CRLNumber().Cmp(a.CRLNumber()) == 0 {
		t.Fatalf("A's list (no entries) and B's (one entry) are both numbered %v", a.CRLNumber())
	}
	// A adopts the raised list in turn: both sign it, as one number.
	if ad, err := a.Adopt(shared); err != nil || !ad.Changed || a.CRLNumber().Cmp(b.CRLNumber()) != 0 {
		t.Fatalf("A adopting the raised list: %+v %v (number %v, B's %v)", ad, err, a.CRLNumber(), b.CRLNumber())
	}
}

// TestAdoptExpired: a serial the shared list dropped as expired
// (SharedList.Expired) is not asked for (Missing) though this directory's
// list names it, and adopting the list drops it here too; a list with as
// many entries, one of them other, is not taken for this directory's.
func TestAdoptExpired(t *testing.T) {
	clk := newClock()
	ca := openCA(t, t.TempDir(), clk)
	old, kept := big.NewInt(0xe1), big.NewInt(0xe2)
	for _, n := range []*big.Int{old, kept} {
		if err := ca.Revoke(n); err != nil {
			t.Fatal(err)
		}
	}
	at := clk.Now().UTC().Truncate(time.Second)
	num := ca.CRLNumber()
	l := SharedList{Number: new(big.Int).Set(num), Revoked: map[string]time.Time{kept.Text(16): at, "e3": at}, Expired: map[string]bool{old.Text(16): true}}
	ad, err := ca.Adopt(l)
	if err != nil || ad.Missing != nil || ad.MinNumber == nil || ad.MinNumber.Cmp(num) <= 0 {
		t.Fatalf("adopting a list as high, with the expired serial dropped: %+v %v", ad, err)
	}
	l.Number = ad.MinNumber
	if ad, err := ca.Adopt(l); err != nil || !ad.Changed {
		t.Fatalf("adopting it raised: %+v %v", ad, err)
	}
	if ca.Revoked(old) || !ca.Revoked(kept) || !ca.Revoked(big.NewInt(0xe3)) {
		t.Fatalf("after adopting: %v %v %v, want the expired dropped", ca.Revoked(old), ca.Revoked(kept), ca.Revoked(big.NewInt(0xe3)))
	}
}

// caAndCopy opens a new CA directory and a copy of it (certificate, key,
// revocation list), as replicas on two hosts hold.
func caAndCopy(t *testing.T, clk *clock) (*CA, *CA) {
	t.Helper()
	dirA := t.TempDir()
	a := openCA(t, dirA, clk)
	dirB := t.TempDir()
	for _, f := range []string{CACertFile, CAKeyFile, CRLFile} {
		b, err := os.ReadFile(filepath.Join(dirA, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dirB, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return a, openCA(t, dirB, clk)
}
