package agent

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestFailedTransferReadsPlainly: a move whose source cannot reach its
// destination fails, and the transfer's status — what the control plane
// quotes in the move's error and event — says so in words with the
// lenders named as api.TransferDestination and api.TransferThisLender:
// not the agent's steps ("agent: reach the destination: nbd: dial: dial
// tcp 127.0.0.1:…"), nor the destination's address; the agent's log keeps
// the whole error. A destination that serves TLS, to a source with no
// cluster CA, says that.
func TestFailedTransferReadsPlainly(t *testing.T) {
	_, srv := newFakeCP(t)
	log := &logtest.Buffer{}
	cfg := moveConfig(srv.URL, t.TempDir(), "src")
	cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	src := start(t, cfg).a
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for i, c := range []struct {
		uri, want, logged string
	}{
		{"nbd://" + closed + "/x", "the destination could not be reached from this lender: connection refused",
			"agent: reach the destination: nbd: dial: dial tcp " + closed},
		{"nbds://" + closed + "/x", "the destination serves TLS and this lender has no cluster CA (its agent's --cacert)",
			"this agent has no cluster CA"},
	} {
		lease := "lease-" + string(rune('a'+i))
		prepareBlock(t, src, lease, int64(i)*movePart, movePart)
		id := "t-" + lease
		if _, err := src.SendTransfer(ctxFor(t), api.TransferOutRequest{ID: id, LeaseID: lease, Export: "x_" + lease, DestURI: c.uri}); err != nil {
			t.Fatal(err)
		}
		st := transferEnd(t, src, id)
		if st.State != api.TransferFailed || st.Error != c.want {
			t.Errorf("%s: transfer %s: %q, want failed: %q", c.uri, st.State, st.Error, c.want)
		}
		for _, w := range []string{"agent: ", "nbd", closed, lease} {
			if strings.Contains(st.Error, w) {
				t.Errorf("%s: the status carries %q: %s", c.uri, w, st.Error)
			}
		}
		if !strings.Contains(log.String(), c.logged) {
			t.Errorf("%s: the agent's log lacks %q:\n%s", c.uri, c.logged, log.String())
		}
	}
}

// transferEnd waits, following its state changes, until a's transfer id
// has ended.
func transferEnd(t *testing.T, a *Agent, id string) api.Transfer {
	t.Helper()
	x, err := a.xfers.get(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	for {
		st := x.waitChange(ctx, api.TransferCopying)
		if st.Done() || ctx.Err() != nil {
			return st
		}
		if st.State != api.TransferCopying {
			t.Fatalf("transfer %s is %s", id, st.State)
		}
	}
}

// TestDestinationFailureWords: a destination that ends the copy's
// connection (its agent stopped, or it gave the move up), does not
// answer a write of the copy, or refuses one, says so, where each read
// "the destination did not take the copy (this lender's agent log says
// why)".
func TestDestinationFailureWords(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: %w", nbd.ErrClosed, io.EOF),
			"the destination closed the copy's connection from this lender during the copy (its agent stopped, or it gave the move up)"},
		{fmt.Errorf("%w: %w", nbd.ErrShutdown, &nbd.Error{Errno: nbd.ESHUTDOWN}),
			"the destination closed the copy's connection from this lender during the copy (its agent stopped, or it gave the move up)"},
		{fmt.Errorf("nbd: write: %w", nbd.ErrTimeout),
			"the destination did not answer a write of the copy from this lender within " + moveRequestTimeout.String()},
		{&nbd.Error{Errno: nbd.ENOSPC, Message: "/srv/disk0.img: no space"},
			"the destination could not write the copy to its device (no space left on device)"},
	} {
		if got := transferWords("disk0", &destError{err: c.err}); got != c.want {
			t.Errorf("%v: %q, want %q", c.err, got, c.want)
		}
	}
}
