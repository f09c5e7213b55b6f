package storetest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// testRevocations: the revocation list kept in the store, through this
// store and another replica on the same database. A certificate recorded
// as issued through one is revoked through the other by its common name
// (only its holder's, only those expiring after the time given, which
// is not the revocation's); serials are revoked once (a second
// revocation returns none and leaves the number); each call
// that revoked any raises the number by one (or to the minimum it is
// given), and every reader sees the same entries with the same number; the number is raised to a minimum,
// never lowered; concurrent revocations of other serials each raise it;
// the serials whose certificates expired (expiry known from their issue,
// or else given with the serial) leave the list, under a higher number,
// and stay recorded as expired; those of unknown expiry are listed so,
// and take the expiry a later revocation of them gives.
func testRevocations(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	rv, ok := s.(store.Revocations)
	if !ok {
		t.Fatalf("%T does not implement store.Revocations", s)
	}
	other := rv
	readers := []store.Revocations{rv}
	if o.Reopen != nil {
		r := o.Reopen(t, s)
		t.Cleanup(func() { r.Close() })
		other = r.(store.Revocations)
		readers = append(readers, other)
	}
	now := time.Unix(1_800_000_000, 0).UTC()
	want := func(what string, number int64, serials ...string) {
		t.Helper()
		for i, r := range readers {
			l, err := r.RevocationList(ctx)
			if err != nil {
				t.Fatalf("%s (reader %d): %v", what, i, err)
			}
			got := slices.Sorted(maps.Keys(l.Revoked))
			slices.Sort(serials)
			if l.Number != number || !slices.Equal(got, serials) {
				t.Fatalf("%s (reader %d): number %d %v, want %d %v", what, i, l.Number, got, number, serials)
			}
		}
	}
	want("an empty list", 0)
	for _, c := range []struct {
		serial, cn string
		notAfter   time.Time
	}{
		{"a1", "node-1", now.Add(time.Hour)},
		{"a2", "node-1", now.Add(2 * time.Hour)},
		{"a0", "node-1", now.Add(-time.Hour)}, // expired
		{"b1", "node-2", now.Add(time.Hour)},
	} {
		if err := rv.RecordIssued(ctx, c.serial, c.cn, c.notAfter, now.Add(-2*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	got, named, err := other.Revoke(ctx, nil, "node-1", now, now, 0)
	slices.Sort(got)
	slices.Sort(named)
	if err != nil || !slices.Equal(got, []string{"a1", "a2"}) || !slices.Equal(named, got) {
		t.Fatalf("revoking node-1's certificates through the other replica: %v (named %v) %v", got, named, err)
	}
	want("node-1's", 1, "a1", "a2")
	l, err := rv.RevocationList(ctx)
	if err != nil || !l.Revoked["a1"].Equal(now) {
		t.Fatalf("a1's revocation time: %v %v, want %v", l.Revoked["a1"], err, now)
	}
	// Named again: none added, every one named (a removal tried again
	// reports them).
	if got, named, err := rv.Revoke(ctx, unknownExpiry("a2"), "node-1", now, now, 0); err != nil || len(got) != 0 || !slices.Equal(slices.Sorted(slices.Values(named)), []string{"a1", "a2"}) {
		t.Fatalf("revoking them again: %v (named %v) %v", got, named, err)
	}
	want("revoked again", 1, "a1", "a2")
	if got, named, err := rv.Revoke(ctx, unknownExpiry("c1", "a1", "c1"), "", time.Time{}, now, 0); err != nil || !slices.Equal(got, []string{"c1"}) || !slices.Equal(named, []string{"c1", "a1"}) {
		t.Fatalf("revoking serials: %v (named %v) %v", got, named, err)
	}
	want("a serial more", 2, "a1", "a2", "c1")
	// A minimum number below the number raised by one is no more; one
	// above is the number (a CA directory whose list is ahead); a call
	// that revoked none raises nothing.
	if got, _, err := rv.Revoke(ctx, unknownExpiry("c2"), "", time.Time{}, now, 1); err != nil || !slices.Equal(got, []string{"c2"}) {
		t.Fatalf("revoking with a lower minimum number: %v %v", got, err)
	}
	want("a lower minimum", 3, "a1", "a2", "c1", "c2")
	if got, _, err := other.Revoke(ctx, unknownExpiry("c3"), "", time.Time{}, now, 10); err != nil || !slices.Equal(got, []string{"c3"}) {
		t.Fatalf("revoking with a higher minimum number: %v %v", got, err)
	}
	want("a higher minimum", 10, "a1", "a2", "c1", "c2", "c3")
	if got, _, err := rv.Revoke(ctx, unknownExpiry("c1"), "", time.Time{}, now, 20); err != nil || len(got) != 0 {
		t.Fatalf("revoking a revoked serial with a minimum number: %v %v", got, err)
	}
	want("none revoked", 10, "a1", "a2", "c1", "c2", "c3")
	if err := other.RaiseRevocationNumber(ctx, 40); err != nil {
		t.Fatal(err)
	}
	want("raised", 40, "a1", "a2", "c1", "c2", "c3")
	if err := rv.RaiseRevocationNumber(ctx, 7); err != nil {
		t.Fatal(err)
	}
	want("not lowered", 40, "a1", "a2", "c1", "c2", "c3")
	// Records expired at a later issue are forgotten: node-2's b1 is no
	// longer revoked by its common name once it expired.
	if err := rv.RecordIssued(ctx, "b2", "node-2", now.Add(4*time.Hour), now.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, _, err := other.Revoke(ctx, nil, "node-2", now.Add(2*time.Hour), now.Add(2*time.Hour), 0); err != nil || !slices.Equal(got, []string{"b2"}) {
		t.Fatalf("revoking node-2's: %v %v", got, err)
	}
	want("node-2's", 41, "a1", "a2", "c1", "c2", "c3", "b2")

	// Concurrent revocations, through both replicas: each raises the
	// number.
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := readers[i%len(readers)]
			got, _, err := r.Revoke(ctx, unknownExpiry(fmt.Sprintf("d%d", i)), "", time.Time{}, now, 0)
			if err == nil && len(got) != 1 {
				err = fmt.Errorf("revoking d%d: %v", i, got)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	all := []string{"a1", "a2", "c1", "c2", "c3", "b2"}
	for i := range n {
		all = append(all, fmt.Sprintf("d%d", i))
	}
	want("after concurrent revocations", 41+n, all...)

	// An expiry given with a serial counts where the store recorded none
	// with its issue (e1); the recorded one wins (f1, recorded as issued
	// to expire in three hours, is given one of now).
	if err := rv.RecordIssued(ctx, "f1", "node-3", now.Add(3*time.Hour), now); err != nil {
		t.Fatal(err)
	}
	if got, _, err := other.Revoke(ctx, []store.RevokedCert{{Serial: "e1", NotAfter: now.Add(time.Hour)}, {Serial: "f1", NotAfter: now}}, "", time.Time{}, now, 0); err != nil || len(got) != 2 {
		t.Fatalf("revoking serials with their expiry: %v %v", got, err)
	}
	all = append(all, "e1", "f1")
	want("with their expiry", 42+n, all...)

	// Expired certificates leave the list (a1: its expiry recorded with
	// its issue; e1: given), under a higher number; those of unknown
	// expiry (c1, the d's) stay; a1 is recorded as expired, and revoking
	// it again leaves it so.
	if got, err := other.ExpireRevoked(ctx, now.Add(90*time.Minute)); err != nil || got != 2 {
		t.Fatalf("expiring: %d %v, want 2", got, err)
	}
	live := slices.DeleteFunc(slices.Clone(all), func(x string) bool { return x == "a1" || x == "e1" })
	want("expired", 43+n, live...)
	if got, err := rv.ExpireRevoked(ctx, now.Add(90*time.Minute)); err != nil || got != 0 {
		t.Fatalf("expiring again: %d %v, want none", got, err)
	}
	if got, _, err := rv.Revoke(ctx, unknownExpiry("a1"), "", time.Time{}, now, 0); err != nil || len(got) != 0 {
		t.Fatalf("revoking an expired serial again: %v %v, want none added", got, err)
	}
	want("expired, revoked again", 43+n, live...)
	for i, r := range readers {
		if l, err := r.RevocationList(ctx); err != nil || !l.Expired["a1"] || !l.Expired["e1"] || len(l.Expired) != 2 {
			t.Fatalf("the expired (reader %d): %v %v, want a1 and e1", i, l.Expired, err)
		}
	}

	// Those of unknown expiry are listed so; revoked again with an
	// expiry (c1), or with one recorded with its issue since (c2, whose
	// given expiry is later), they take it, none is added, the number
	// stays; then they expire off the list as the others do.
	noExpiry := []string{"c1", "c2", "c3"}
	for i := range n {
		noExpiry = append(noExpiry, fmt.Sprintf("d%d", i))
	}
	wantNoExpiry := func(what string, serials []string) {
		t.Helper()
		for i, r := range readers {
			l, err := r.RevocationList(ctx)
			if got := slices.Sorted(slices.Values(l.NoExpiry)); err != nil || !slices.Equal(got, serials) {
				t.Fatalf("%s (reader %d): of unknown expiry %v %v, want %v", what, i, got, err, serials)
			}
		}
	}
	wantNoExpiry("of unknown expiry", noExpiry)
	if err := rv.RecordIssued(ctx, "c2", "node-4", now.Add(time.Hour), now); err != nil {
		t.Fatal(err)
	}
	if got, named, err := other.Revoke(ctx, []store.RevokedCert{{Serial: "c1", NotAfter: now.Add(time.Hour)}, {Serial: "c2", NotAfter: now.Add(9 * time.Hour)}}, "", time.Time{}, now, 0); err != nil || len(got) != 0 || len(named) != 2 {
		t.Fatalf("revoking serials of unknown expiry again with one: %v (named %v) %v, want none added", got, named, err)
	}
	wantNoExpiry("given their expiry", noExpiry[2:])
	want("given their expiry", 43+n, live...)
	if got, err := rv.ExpireRevoked(ctx, now.Add(90*time.Minute)); err != nil || got != 2 {
		t.Fatalf("expiring those given their expiry: %d %v, want 2", got, err)
	}
	live = slices.DeleteFunc(live, func(x string) bool { return x == "c1" || x == "c2" })
	want("those given their expiry expired", 44+n, live...)

	// By its common name, those expiring after the time given, which is
	// not the revocation's: g1, expired half an hour before it, is
	// revoked then; g0, expired an hour and a half before, is not.
	later := now.Add(10 * time.Hour)
	for serial, notAfter := range map[string]time.Time{"g0": later.Add(-90 * time.Minute), "g1": later.Add(-30 * time.Minute)} {
		if err := rv.RecordIssued(ctx, serial, "node-5", notAfter, later.Add(-2*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if got, named, err := other.Revoke(ctx, nil, "node-5", later.Add(-time.Hour), later, 0); err != nil || !slices.Equal(got, []string{"g1"}) || !slices.Equal(named, got) {
		t.Fatalf("revoking node-5's expiring after an hour before: %v (named %v) %v, want g1", got, named, err)
	}
	want("node-5's", 45+n, append(live, "g1")...)
	if l, err := rv.RevocationList(ctx); err != nil || !l.Revoked["g1"].Equal(later) {
		t.Fatalf("g1's revocation time: %v %v, want %v", l.Revoked["g1"], err, later)
	}
}

// unknownExpiry are serials to revoke, their expiry not given.
func unknownExpiry(serials ...string) []store.RevokedCert {
	out := make([]store.RevokedCert, len(serials))
	for i, s := range serials {
		out[i] = store.RevokedCert{Serial: s}
	}
	return out
}
