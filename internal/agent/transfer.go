package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/resource"
)

// Moving a part of a lease to another lender while its borrower uses it
// (the control plane's `rialto lease move` and node drain). The control
// plane drives a transfer through both agents' APIs:
//
//  1. POST /agent/v1/transfers/in on the destination: it reserves the new
//     range (in the wipe journal first, so that a crash wipes it) and
//     serves it as a writable export named by the transfer's token, a
//     credential for this transfer only that expires with it.
//  2. POST /agent/v1/transfers/out on the source, naming the destination's
//     URI: the source pushes. It answers at once, and the transfer's own
//     goroutine does the rest, which the control plane follows through
//     the transfer's state: it marks the writes the borrower makes from
//     then on (a dirty map kept by the data plane; starting it waits for
//     the writes under way, a minute at most: see SendTransfer), copies
//     the part once (ranges that read as zeroes are sent as zeroing
//     requests, not bytes), then what was written meanwhile, pass after
//     pass, until little is left or the passes stop shrinking; then it
//     holds the borrower's writes (reads go on), copies the rest, makes
//     the copy durable at the destination and is "ready".
//  3. The control plane seals the source (writes stay held whatever the
//     time, until commit or abort: without a seal the source gives up
//     after HoldSeconds and serves the writes again), commits the
//     destination (it serves the part under its new export name, knowing
//     the lease's expiry the commit brings; with no time left by then,
//     the part is the lease's export but not served, as a prepare with no
//     time left, until a heartbeat answer shows time left), records the
//     part's new place in the lease, and commits the source: it retires
//     the old export (the held writes and any request after that point
//     are answered ESHUTDOWN, requests under way complete, the
//     connections close: a borrower's `rialto attach` redials where the
//     lease now says), tears it down, journals the old range (durably:
//     refused to every prepare and transfer until wiped, and wiped by a
//     restart) and answers; the range's wipe runs in the background, on
//     a goroutine the agent owns (its stop interrupts it: the range stays
//     journalled, wiped before the next run serves anything).
//  4. Anything else aborts both sides: the source serves the part as
//     before, the destination wipes what it received.
//
// Why push: the source is where the writes land, so the dirty map, the
// hold and the last pass are all local to it, and the only thing the
// destination has to offer is a range to write into. The bytes go from
// lender to lender over the data plane (NBD for block, the memory protocol
// for memory), never through the borrower or the control plane.
//
// Transfers live in memory: an agent restart forgets them. The source's
// part is an ordinary export (served again once the control plane
// confirms it); the destination's range is in the wipe journal until
// committed, so a restart wipes it.

// Mover is implemented by drivers whose exports can move to another
// lender while they are served.
type Mover interface {
	// ReceiveMove serves e's range on the destination as a writable
	// export named token (not as e's export yet) and returns its URI.
	ReceiveMove(ctx context.Context, e Export, token string) (string, error)
	// ActivateMove serves a range received by ReceiveMove as e's export
	// (the token's export stops being served). With e.suspended (its
	// lease's known expiry has passed) it makes it e's export without
	// serving it, not for a single request: as Suspend (Suspender) leaves
	// an export, until Resume. It may be called again (a commit tried
	// again) after one that failed or one that succeeded: each leaves
	// the part e's export, served or not as its e says, whatever the
	// calls before did.
	ActivateMove(ctx context.Context, e Export) (api.PrepareResponse, error)
	// SendMove starts marking the writes to e (served here) and returns
	// its side of the copy.
	SendMove(ctx context.Context, e Export) (MoveSource, error)
	// DialMove connects to a destination's ReceiveMove URI to send e
	// (served here) there.
	DialMove(ctx context.Context, e Export, uri string) (MoveDest, error)
}

// Span is a range of a part to copy; Zero says it reads as zeroes (the
// destination is told to zero it instead of being sent bytes).
type Span struct {
	Off, Len int64
	Zero     bool
}

// MoveSource is the source side of a transfer: the part as it is served
// here, with the writes to it marked since SendMove.
type MoveSource interface {
	Size() int64
	// Layout covers the whole part in order, saying which ranges read as
	// zeroes (for the first pass).
	Layout() ([]Span, error)
	ReadAt(p []byte, off int64) (int, error)
	// Take returns the ranges written since the last Take and clears
	// them; Dirty is about how many bytes that is.
	Take() []dirty.Range
	Dirty() int64
	// PauseWrites holds the writes that have not started and returns once
	// the ones under way are done (and marked); ResumeWrites lets them go.
	PauseWrites(ctx context.Context) error
	ResumeWrites() error
	// Retire stops serving the part cleanly: held writes and later
	// requests are refused with the data plane's "moved" answer, requests
	// under way complete, connections close.
	Retire(ctx context.Context) error
	// Close stops marking writes and lets held ones go (unless retired).
	Close() error
}

// MoveDest is the destination side of a transfer, as the source reaches
// it. A MoveDest with a method FreshZero() bool that answers true reads
// as zeroes wherever it was not written: the first pass sends nothing for
// ranges of zeroes.
type MoveDest interface {
	WriteAt(ctx context.Context, p []byte, off int64) error
	// Zero makes [off, off+n) read as zeroes.
	Zero(ctx context.Context, off, n int64) error
	// Flush makes what was written durable.
	Flush(ctx context.Context) error
	Close() error
}

// Transfer defaults.
const (
	defaultMaxPasses     = 8
	defaultConvergeBytes = 8 << 20
	defaultHold          = 30 * time.Second
	// copyChunk is the largest request the copier sends; copyDepth how
	// many it keeps in flight.
	copyChunk = 1 << 20
	copyDepth = 8
	// zeroGrain is the granularity at which the copier looks for zeroes.
	zeroGrain = 4 << 10
	// statusWait bounds a GET of a transfer's status ?while it is in a
	// state.
	statusWait = time.Second
	// keepDone is how long a finished transfer's state stays readable.
	keepDone = 10 * time.Minute
)

// transferCommitting is a source's state while its commit runs.
const transferCommitting = "committing"

// Transfer errors.
var (
	ErrNoTransfer    = errors.New("agent: no such transfer")
	ErrTransferState = errors.New("agent: the transfer is not in a state that allows this")
	ErrCannotMove    = errors.New("agent: this kind of export cannot move")
)

// transfer is one transfer on this agent, either side.
type transfer struct {
	id   string
	role string // "out" or "in"

	mu sync.Mutex
	st api.Transfer
	e  Export // out: the part served here; in: the part as it will be served

	// out
	src    MoveSource
	dst    MoveDest
	cancel context.CancelFunc // ends the transfer's context: its start, its copier
	sealed chan struct{}      // closed by seal
	finish chan struct{}      // closed by commit or abort: the copier returns
	done   chan struct{}      // closed when the copier has returned
	heldAt time.Time

	changed chan struct{} // closed at every state change (t.mu)

	// in
	wipe    *pendingWipe
	expires time.Time // agent clock
}

func (t *transfer) status() api.Transfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.st
	if !t.heldAt.IsZero() && (st.State == api.TransferCopying || st.State == api.TransferReady || st.State == api.TransferSealed) {
		st.HeldMillis = float64(time.Since(t.heldAt).Microseconds()) / 1e3
	}
	if t.src != nil && !st.Done() {
		st.Dirty = t.src.Dirty()
	}
	return st
}

func (t *transfer) setState(s string) {
	t.mu.Lock()
	t.setLocked(s)
	t.mu.Unlock()
}

// setLocked moves t to state s and wakes the status waiters; t.mu is held.
func (t *transfer) setLocked(s string) {
	t.st.State, t.st.UpdatedAt = s, time.Now()
	if t.changed != nil {
		close(t.changed)
	}
	t.changed = make(chan struct{})
}

// waitChange returns t's state once it is no longer from (or ctx ends).
func (t *transfer) waitChange(ctx context.Context, from string) api.Transfer {
	for {
		t.mu.Lock()
		if t.st.State != from {
			t.mu.Unlock()
			return t.status()
		}
		if t.changed == nil {
			t.changed = make(chan struct{})
		}
		ch := t.changed
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return t.status()
		}
	}
}

// transfers is the agent's table of transfers and the owner of their
// copiers.
type transfers struct {
	mu     sync.Mutex
	m      map[string]*transfer
	closed bool
	wg     sync.WaitGroup
}

func (ts *transfers) get(id string) (*transfer, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.m[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNoTransfer, id)
	}
	return t, nil
}

// add records t, refusing a duplicate ID, a closed table or, for an
// outgoing transfer, one of an export another transfer under way moves
// from here: judged and recorded under one lock, so that of concurrent
// moves of an export only one is recorded. run, if not nil, is t's
// goroutine: started once t is recorded, owned by the table
// (stopTransfers waits for it).
func (ts *transfers) add(t *transfer, run func()) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed {
		return fmt.Errorf("%w: the agent is stopping", ErrTransferState)
	}
	if ts.m == nil {
		ts.m = map[string]*transfer{}
	}
	if _, dup := ts.m[t.id]; dup {
		return fmt.Errorf("%w: transfer %q exists", ErrConflict, t.id)
	}
	if t.role == "out" && ts.movingLocked(t.e.Request.Export) {
		return fmt.Errorf("%w: the export is already moving", ErrConflict)
	}
	ts.m[t.id] = t
	if run != nil {
		// Under ts.mu, the table open: before any wait of stopTransfers.
		ts.wg.Go(run)
	}
	return nil
}

func (ts *transfers) list() []*transfer {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make([]*transfer, 0, len(ts.m))
	for _, t := range ts.m {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// Transfers lists the transfers the agent knows (under way, and finished
// in the last ten minutes).
func (a *Agent) Transfers() []api.Transfer {
	var out []api.Transfer
	for _, t := range a.xfers.list() {
		out = append(out, t.status())
	}
	return out
}

// Transfer returns one transfer's state.
func (a *Agent) Transfer(id string) (api.Transfer, error) {
	t, err := a.xfers.get(id)
	if err != nil {
		return api.Transfer{}, err
	}
	return t.status(), nil
}

// stopTransfers aborts every transfer under way and waits for the copiers
// (Run's end).
func (a *Agent) stopTransfers(ctx context.Context) {
	a.xfers.mu.Lock()
	a.xfers.closed = true
	a.xfers.mu.Unlock()
	for _, t := range a.xfers.list() {
		if t.status().Done() {
			continue
		}
		a.log.Info("agent stopping: giving up a move under way", "transfer", t.id)
		switch err := a.abortTransfer(ctx, t, "the agent stopped", true); {
		case errors.Is(err, errSealed):
			// Its writes stay held: the lease may point at the
			// destination already. The process ends them.
			t.mu.Lock()
			cancel := t.cancel
			t.mu.Unlock()
			cancel()
		case err != nil:
			a.log.Warn("aborting a transfer", "transfer", t.id, "err", err)
		}
	}
	a.xfers.wg.Wait()
}

func (a *Agent) mover(k api.Kind) (Mover, error) {
	m, ok := a.drivers[k].(Mover)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrCannotMove, k)
	}
	return m, nil
}

// ReceiveTransfer executes a TransferInRequest on the destination.
func (a *Agent) ReceiveTransfer(ctx context.Context, req api.TransferInRequest) (api.TransferInResponse, error) {
	if req.ID == "" || req.Token == "" {
		return api.TransferInResponse{}, fmt.Errorf("%w: id and token are required", ErrBadRequest)
	}
	now := a.clock.Now()
	part := req.Part
	// Both times left are counted from the earliest the request can have
	// left the control plane (Part.TimeoutSeconds is the call's bound).
	exp := requestExpiry(req.ExpiresAt, req.Now, now, part.TimeoutSeconds)
	part.ExpiresAt = requestExpiry(part.ExpiresAt, part.Now, now, part.TimeoutSeconds)
	part.Now, part.TimeoutSeconds = time.Time{}, 0
	// The part's export name derives from the move (the transfer's ID):
	// kept with the export, and listed in heartbeats, so that a control
	// plane whose database does not know the move (restored from an
	// older backup) can check the name (api.ServedExport).
	part.Move = req.ID
	if exp.IsZero() {
		exp = now.Add(time.Hour)
	}
	part, dev, _, err := a.validate(part)
	if err != nil {
		return api.TransferInResponse{}, err
	}
	mv, err := a.mover(dev.Kind)
	if err != nil {
		return api.TransferInResponse{}, err
	}
	t := &transfer{id: req.ID, role: "in", expires: exp,
		st: api.Transfer{ID: req.ID, LeaseID: part.LeaseID, Kind: dev.Kind, Role: "in", State: api.TransferReceiving,
			Size: part.Length, StartedAt: time.Now(), UpdatedAt: time.Now()}}
	if err := a.xfers.add(t, nil); err != nil {
		return api.TransferInResponse{}, err
	}
	fail := func(err error) (api.TransferInResponse, error) {
		a.xfers.mu.Lock()
		delete(a.xfers.m, req.ID)
		a.xfers.mu.Unlock()
		return api.TransferInResponse{}, err
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if err := ctx.Err(); err != nil {
		// The caller gave up (as for a prepare): the control plane
		// counts the move failed, and its abort may have come and gone.
		return fail(fmt.Errorf("%w: transfer %s: %w", ErrGaveUp, req.ID, err))
	}
	a.mu.Lock()
	_, exists := a.exports[part.Export]
	other, wiping := a.rangeBusyLocked(part)
	endpoint, host := a.endpoints[dev.Kind], a.host
	a.mu.Unlock()
	switch {
	case exists:
		return fail(fmt.Errorf("%w: the part's export is already served here", ErrConflict))
	case other != "":
		a.log.Warn("refused a transfer into a range in use", "lease", part.LeaseID, "device", dev.Name, "served_for", other)
		return fail(fmt.Errorf("%w: the range overlaps one this agent serves for another lease", ErrOverlap))
	case wiping:
		return fail(refuse(wipingWords(dev.Name), fmt.Errorf("%w: the range is being wiped", ErrOverlap)))
	}
	e := Export{Request: part, Device: dev, Endpoint: endpoint, Host: host, incoming: true, deadline: clock.NewDeadline(a.clock)}
	// The received bytes are a tenant's: journal the range before the
	// first one can arrive, so that a crash wipes it.
	var w *pendingWipe
	if a.needsWipe(e) {
		if w, err = a.journalWipe(e, true); err != nil {
			a.dropWipe(w)
			return fail(err)
		}
	}
	uri, err := mv.ReceiveMove(ctx, e, req.Token)
	if err != nil {
		a.dropWipe(w)
		return fail(deviceRefusal("receive", part, dev.Name, err))
	}
	gaveUp := ctx.Err()
	t.mu.Lock()
	aborted := t.st.State != api.TransferReceiving
	if !aborted && gaveUp == nil {
		t.e, t.wipe = e, w
	}
	t.mu.Unlock()
	if aborted || gaveUp != nil {
		// Aborted meanwhile (abortTransfer left the undoing to this),
		// or its caller gave up: the control plane gave the move up.
		// Nobody has the URI, so nothing reached the range.
		if err := a.drivers[dev.Kind].Teardown(context.WithoutCancel(ctx), e); err != nil {
			a.log.Warn("undoing a transfer given up while it was received", "transfer", req.ID, "err", err)
		} else {
			a.dropWipe(w)
		}
		if !aborted {
			return fail(fmt.Errorf("%w: transfer %s: %w", ErrGaveUp, req.ID, gaveUp))
		}
		return api.TransferInResponse{}, fmt.Errorf("%w: transfer %s was aborted while it was received", ErrTransferState, req.ID)
	}
	a.mu.Lock()
	a.exports[part.Export] = e
	a.exportsChangedLocked()
	a.mu.Unlock()
	a.wakeLoop() // to give it up at its expiry (heartbeatLoop)
	a.mTransfers.WithLabelValues("in", "started").Inc()
	a.log.Info("receiving a moved part", "transfer", req.ID, "lease", part.LeaseID, "device", dev.Name,
		"offset", part.Offset, "length", part.Length, "token", resource.Fingerprint(req.Token))
	return api.TransferInResponse{URI: uri}, nil
}

// dropWipe forgets a journal entry whose range was never written.
func (a *Agent) dropWipe(w *pendingWipe) {
	if w == nil {
		return
	}
	if err := a.persistWipes(w); err != nil {
		a.log.Warn("wipe journal", "err", err)
	}
}

// SendTransfer executes a TransferOutRequest on the source: it checks the
// request and returns at once (the control plane bounds the call, see
// moveCallTimeout there). The transfer's own goroutine then reaches the
// destination, starts marking the borrower's writes and copies (runOut).
// Starting to mark waits for the writes under way that did not see the
// move, and one whose payload is still arriving is waited for up to the
// data plane's limit (nbd.Server.MoveWaitLimit, donor.RefusalWaitLimit: a
// minute), longer than a call may last: a start that fails shows in the
// transfer's state (failed, with its error), which the control plane
// follows, and an abort at any point of it ends it (the part served here
// as before).
func (a *Agent) SendTransfer(_ context.Context, req api.TransferOutRequest) (api.Transfer, error) {
	if req.ID == "" || req.Export == "" || req.DestURI == "" {
		return api.Transfer{}, fmt.Errorf("%w: id, export and dest_uri are required", ErrBadRequest)
	}
	a.mu.Lock()
	e, ok := a.exports[req.Export]
	a.mu.Unlock()
	switch {
	case !ok || (req.LeaseID != "" && e.Request.LeaseID != req.LeaseID):
		return api.Transfer{}, fmt.Errorf("%w: no such export", ErrNoDevice)
	case !e.serving():
		return api.Transfer{}, fmt.Errorf("%w: the export is not being served", ErrTransferState)
	}
	mv, err := a.mover(e.Device.Kind)
	if err != nil {
		return api.Transfer{}, err
	}
	// The transfer's context: an abort (or the agent's stop) cancels it,
	// at whatever stage the transfer is.
	ctx, cancel := context.WithCancel(context.Background())
	t := &transfer{id: req.ID, role: "out", e: e, cancel: cancel,
		sealed: make(chan struct{}), finish: make(chan struct{}), done: make(chan struct{}),
		st: api.Transfer{ID: req.ID, LeaseID: e.Request.LeaseID, Kind: e.Device.Kind, Role: "out", State: api.TransferCopying,
			Size: e.Request.Length, StartedAt: time.Now(), UpdatedAt: time.Now()}}
	// Recorded only if no other transfer moves the export (add judges
	// that and records t under one lock: of concurrent requests to move
	// it, one starts, the others are refused with ErrConflict).
	if err := a.xfers.add(t, func() { a.sendOut(ctx, t, mv, req) }); err != nil {
		cancel()
		return api.Transfer{}, err
	}
	a.mTransfers.WithLabelValues("out", "started").Inc()
	a.log.Info("moving a part", "transfer", req.ID, "lease", e.Request.LeaseID, "device", e.Device.Name,
		"length", e.Request.Length, "to", uriAddress(req.DestURI))
	return t.status(), nil
}

// sendOut is an outgoing transfer's goroutine: it reaches the destination,
// starts marking the writes and runs the copier. It closes t.done when it
// returns (an abort waits for that).
func (a *Agent) sendOut(ctx context.Context, t *transfer, mv Mover, req api.TransferOutRequest) {
	defer close(t.done)
	src, dst, err := a.beginOut(ctx, t, mv, req.DestURI)
	if err != nil {
		if ctx.Err() == nil { // else aborted: the abort ends the transfer
			a.failOut(t, err)
		}
		return
	}
	t.mu.Lock()
	aborted := t.st.State != api.TransferCopying
	if !aborted {
		t.src, t.dst = src, dst
	}
	t.mu.Unlock()
	if aborted {
		// Aborted as the start ended: no copy starts, the part is served
		// here as before.
		if err := src.Close(); err != nil {
			a.log.Debug("ending the move", "err", err)
		}
		dst.Close()
		return
	}
	a.runOut(ctx, t, req)
}

// beginOut reaches t's destination (within moveRequestTimeout) and starts
// marking the writes to t's part.
func (a *Agent) beginOut(ctx context.Context, t *transfer, mv Mover, uri string) (MoveSource, MoveDest, error) {
	dctx, cancel := context.WithTimeout(ctx, moveRequestTimeout)
	dst, err := mv.DialMove(dctx, t.e, uri)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("agent: reach the destination: %w", &destError{reach: true, err: err})
	}
	src, err := mv.SendMove(ctx, t.e)
	if err != nil {
		dst.Close()
		err = fmt.Errorf("agent: start the move: %w", err)
		if publicMessage(err) == failedWords {
			err = refuse(api.TransferThisLender+" could not start marking the borrower's writes to the part (its agent's log says why)", err)
		}
		return nil, nil, err
	}
	return src, dst, nil
}

// movingLocked reports whether a transfer under way moves export name
// from here; ts.mu is held (and each transfer's mu is taken after it).
func (ts *transfers) movingLocked(name string) bool {
	for _, t := range ts.m {
		if t.role != "out" || t.e.Request.Export != name {
			continue
		}
		t.mu.Lock()
		done := t.st.Done()
		t.mu.Unlock()
		if !done {
			return true
		}
	}
	return false
}

// runOut is the source's copier: the passes, the hold, then waiting for
// the control plane's seal, commit or abort.
func (a *Agent) runOut(ctx context.Context, t *transfer, req api.TransferOutRequest) {
	maxPasses := req.MaxPasses
	if maxPasses <= 0 {
		maxPasses = defaultMaxPasses
	}
	converge := req.ConvergeBytes
	if converge <= 0 {
		converge = defaultConvergeBytes
	}
	hold := time.Duration(req.HoldSeconds * float64(time.Second))
	if hold <= 0 {
		hold = defaultHold
	}
	kind := string(t.e.Device.Kind)
	err := func() error {
		spans, err := t.src.Layout()
		if err != nil {
			return err
		}
		t.mu.Lock()
		t.st.Pass = 1
		t.mu.Unlock()
		if err := a.copySpans(ctx, t, spans, true); err != nil {
			return err
		}
		// Passes over what was written meanwhile, while they shrink.
		prev := t.src.Size()
		for pass := 2; pass <= maxPasses; pass++ {
			d := t.src.Dirty()
			if d <= converge || (pass > 2 && d >= prev) {
				break
			}
			prev = d
			t.mu.Lock()
			t.st.Pass = pass
			t.mu.Unlock()
			if err := a.copySpans(ctx, t, rangeSpans(t.src.Take()), false); err != nil {
				return err
			}
		}
		// The last pass, with the borrower's writes held.
		if err := t.src.PauseWrites(ctx); err != nil {
			return fmt.Errorf("agent: hold the writes: %w", err)
		}
		t.mu.Lock()
		t.heldAt = time.Now()
		t.st.Pass++
		t.mu.Unlock()
		if err := a.copySpans(ctx, t, rangeSpans(t.src.Take()), false); err != nil {
			return err
		}
		if err := t.dst.Flush(ctx); err != nil {
			return fmt.Errorf("agent: flush the destination: %w", &destError{err: err})
		}
		return nil
	}()
	if err != nil {
		if ctx.Err() == nil {
			a.failOut(t, err)
		}
		return
	}
	// The copy is complete and durable where it goes: close the
	// connection to the destination (its commit stops serving the token's
	// export) and wait for the control plane.
	if err := t.dst.Close(); err != nil {
		a.log.Debug("closing the transfer's connection", "err", err)
	}
	t.mu.Lock()
	if t.st.State != api.TransferCopying {
		// Aborted as the copy ended: the abort ends the move.
		t.mu.Unlock()
		return
	}
	t.setLocked(api.TransferReady)
	t.mu.Unlock()
	a.log.Info("moved part ready to switch", "transfer", t.id, "lease", t.e.Request.LeaseID, "kind", kind)
	timer := time.NewTimer(hold)
	defer timer.Stop()
	select {
	case <-t.sealed:
	case <-timer.C:
		why := fmt.Sprintf("not sealed within %v of the copy's end; the part is served here again", hold)
		a.failOut(t, refuse(why, errors.New("agent: "+why)))
		return
	case <-t.finish:
		return
	case <-ctx.Done():
		return
	}
	select {
	case <-t.finish:
	case <-ctx.Done():
	}
}

// failOut gives an outgoing transfer up after err: the part is served
// here as before.
func (a *Agent) failOut(t *transfer, err error) {
	t.mu.Lock()
	if t.st.Done() || t.st.State == api.TransferSealed {
		t.mu.Unlock()
		return
	}
	// The status says it in words for the tenant (transferWords); the
	// log has the whole error, written (and counted) before the failure
	// is visible, so that whoever sees it finds it in the log.
	a.log.Warn("moving a part failed; it is served here as before", "transfer", t.id, "lease", t.e.Request.LeaseID, "err", err)
	a.mTransfers.WithLabelValues("out", "failed").Inc()
	t.st.Error = transferWords(t.e.Device.Name, err)
	t.setLocked(api.TransferFailed)
	t.mu.Unlock()
	a.endOut(t)
}

// endOut releases an outgoing transfer's resources (not after a commit:
// the part is retired then).
func (a *Agent) endOut(t *transfer) {
	t.mu.Lock()
	src, dst := t.src, t.dst
	t.mu.Unlock()
	if src != nil {
		if err := src.Close(); err != nil {
			a.log.Debug("ending the move", "err", err)
		}
	}
	if dst != nil {
		dst.Close()
	}
	t.mu.Lock()
	if !t.heldAt.IsZero() {
		a.mHeld.WithLabelValues(string(t.e.Device.Kind)).Observe(time.Since(t.heldAt).Seconds())
		t.st.HeldMillis = float64(time.Since(t.heldAt).Microseconds()) / 1e3
		t.heldAt = time.Time{}
	}
	t.mu.Unlock()
}

// rangeSpans turns dirty ranges into spans to copy.
func rangeSpans(rs []dirty.Range) []Span {
	out := make([]Span, len(rs))
	for i, r := range rs {
		out[i] = Span{Off: r.Off, Len: r.Len}
	}
	return out
}

// copySpans copies spans from t's source to its destination, copyDepth
// requests of up to copyChunk in flight. A chunk that reads as zeroes is
// sent as a zeroing request, or not at all on the first pass (first) to a
// destination that is zero where it was not written.
func (a *Agent) copySpans(ctx context.Context, t *transfer, spans []Span, first bool) error {
	kind := string(t.e.Device.Kind)
	fz, _ := t.dst.(interface{ FreshZero() bool })
	skipZero := first && fz != nil && fz.FreshZero()
	type chunk struct {
		off, n int64
		zero   bool
	}
	work := make(chan chunk)
	errc := make(chan error, copyDepth)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range copyDepth {
		wg.Go(func() {
			buf := make([]byte, copyChunk)
			for c := range work {
				var err error
				var sent int64
				// zero sends a run of zeroes: a zeroing request, or
				// nothing on a first pass to a fresh destination.
				zero := func(off, n int64) error {
					if skipZero {
						return nil
					}
					if fz != nil {
						sent += n // the destination takes zeroes as bytes
					}
					if err := t.dst.Zero(ctx, off, n); err != nil {
						return &destError{err: err}
					}
					return nil
				}
				if c.zero {
					err = zero(c.off, c.n)
				} else if _, err = t.src.ReadAt(buf[:c.n], c.off); err != nil {
					err = &sourceError{err}
				} else {
					// Runs of zero pages and of data, sent apart.
					p := buf[:c.n]
					for i := int64(0); i < c.n && err == nil; {
						z := allZero(p[i:min(i+zeroGrain, c.n)])
						j := i + zeroGrain
						for j < c.n && allZero(p[j:min(j+zeroGrain, c.n)]) == z {
							j += zeroGrain
						}
						j = min(j, c.n)
						if z {
							err = zero(c.off+i, j-i)
						} else {
							if err = t.dst.WriteAt(ctx, p[i:j], c.off+i); err != nil {
								err = &destError{err: err}
							}
							sent += j - i
						}
						i = j
					}
				}
				if err != nil {
					errc <- err
					cancel()
					for range work {
					}
					return
				}
				t.mu.Lock()
				t.st.Copied += sent
				t.st.Skipped += c.n - sent
				t.st.UpdatedAt = time.Now()
				t.mu.Unlock()
				a.mMoved.WithLabelValues(kind).Add(float64(sent))
				a.mSkipped.WithLabelValues(kind).Add(float64(c.n - sent))
			}
		})
	}
	func() {
		defer close(work)
		for _, s := range spans {
			step := int64(copyChunk)
			if s.Zero {
				step = 1 << 30 // zeroing requests carry no payload
			}
			for off := s.Off; off < s.Off+s.Len; off += step {
				select {
				case work <- chunk{off: off, n: min(step, s.Off+s.Len-off), zero: s.Zero}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	wg.Wait()
	select {
	case err := <-errc:
		return fmt.Errorf("agent: copy: %w", err)
	default:
	}
	return ctx.Err()
}

var zeroChunk = make([]byte, copyChunk)

func allZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroChunk))
		if !bytes.Equal(p[:n], zeroChunk[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

// SealTransfer seals a ready outgoing transfer: the writes stay held
// until commit or abort.
func (a *Agent) SealTransfer(_ context.Context, id string) (api.Transfer, error) {
	t, err := a.xfers.get(id)
	if err != nil {
		return api.Transfer{}, err
	}
	t.mu.Lock()
	switch {
	case t.role != "out":
		t.mu.Unlock()
		return api.Transfer{}, fmt.Errorf("%w: only the source seals", ErrTransferState)
	case t.st.State == api.TransferSealed:
	case t.st.State != api.TransferReady:
		st := t.st.State
		t.mu.Unlock()
		return api.Transfer{}, fmt.Errorf("%w: it is %s, not ready", ErrTransferState, st)
	default:
		t.setLocked(api.TransferSealed)
		close(t.sealed)
	}
	t.mu.Unlock()
	return t.status(), nil
}

// CommitTransfer commits a transfer: on the destination the part is
// served under its export name, knowing the lease's expiry that req
// brings (counted as a prepare's: from req.TimeoutSeconds before it
// arrived; with no time left it is made the export but not served, until
// a heartbeat answer shows time left); on the source (sealed) the old
// export is retired and torn down, and its range journalled: the commit
// answers then, and the range is wiped in the background (refused to
// every prepare and transfer until it is).
func (a *Agent) CommitTransfer(ctx context.Context, id string, req api.TransferCommitRequest) (api.TransferCommitResponse, error) {
	arrived := a.clock.Now()
	t, err := a.xfers.get(id)
	if err != nil {
		return api.TransferCommitResponse{}, err
	}
	if t.role == "in" {
		return a.commitIn(ctx, t, requestExpiry(req.ExpiresAt, req.Now, arrived, req.TimeoutSeconds))
	}
	// The old range's wipe runs in the background: the control plane's
	// call is bounded, and a slow wipe outlasted it.
	wipes, err := a.commitOut(ctx, t)
	a.wipeInBackground(wipes)
	return api.TransferCommitResponse{}, err
}

// commitIn commits an incoming transfer; exp is the lease's expiry the
// commit brought (zero: none).
func (a *Agent) commitIn(ctx context.Context, t *transfer, exp time.Time) (api.TransferCommitResponse, error) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	t.mu.Lock()
	st := t.st.State
	if st == api.TransferReceiving {
		// Claimed: an abort now finds it committing.
		t.setLocked(transferCommitting)
	}
	t.mu.Unlock()
	switch st {
	case api.TransferCommitted:
		a.mu.Lock()
		e := a.exports[t.e.Request.Export]
		a.mu.Unlock()
		return api.TransferCommitResponse{URI: e.URI}, nil
	case api.TransferReceiving:
	default:
		return api.TransferCommitResponse{}, fmt.Errorf("%w: it is %s", ErrTransferState, st)
	}
	resp, err := a.activate(ctx, t, exp)
	if err != nil {
		t.setState(api.TransferReceiving) // not served: the abort or the expiry wipes it
	}
	return resp, err
}

// activate serves a received part as the lease's (commitIn's work), whose
// lease expires at exp (zero: unknown); opMu is held. A part whose known
// expiry has passed by then is made the lease's export but not served
// (suspended, as a prepare with no time left is): an answer that shows
// the lease has time left serves it (reconcile).
func (a *Agent) activate(ctx context.Context, t *transfer, exp time.Time) (api.TransferCommitResponse, error) {
	mv, err := a.mover(t.e.Device.Kind)
	if err != nil {
		return api.TransferCommitResponse{}, err
	}
	e := t.e
	a.mu.Lock()
	if cur, ok := a.exports[e.Request.Export]; !exp.IsZero() {
		// The lease's expiry at the commit: the latest known here (the
		// export counts as prepared now, so that no answer to a
		// heartbeat sent before changes it).
		e.Request.ExpiresAt = exp
	} else if ok && cur.incoming {
		// An older control plane's commit: the lease's expiry as
		// heartbeat answers brought it while the part was moving here,
		// if the lease has other parts here (t.e has the one the
		// transfer came with).
		e.Request.ExpiresAt = cur.Request.ExpiresAt
	}
	a.mu.Unlock()
	// No time left: the driver makes it the lease's export without
	// serving it, not for a single request (no window in which the
	// export is served before it is stopped).
	hold := a.noTimeLeft(e.Request)
	e.suspended = hold
	if e.deadline != nil {
		e.deadline.Set(e.Request.ExpiresAt) // before the driver serves it as the lease's
	}
	resp, err := mv.ActivateMove(ctx, e)
	if err != nil {
		return api.TransferCommitResponse{}, fmt.Errorf("agent: serve the moved part: %w", err)
	}
	name := e.Request.Export
	e.incoming, e.URI = false, resp.URI
	a.mu.Lock()
	received, wasReceived := a.exports[name]
	a.prepares++
	e.prepared = a.prepares
	a.exports[name] = e
	a.exportsChangedLocked()
	a.mu.Unlock()
	// Persist the export before the range leaves the wipe journal: a
	// crash in between restores nothing and wipes the range (the source
	// still holds the part: it commits only after this returns).
	if err := a.saveExportsLocked(); err != nil {
		a.unactivate(ctx, mv, e, received, wasReceived, false)
		return api.TransferCommitResponse{}, fmt.Errorf("agent: persist the moved part: %w", err)
	}
	if t.wipe != nil {
		if err := a.persistWipes(t.wipe); err != nil {
			a.unactivate(ctx, mv, e, received, wasReceived, true)
			return api.TransferCommitResponse{}, err
		}
	}
	t.mu.Lock()
	t.e = e
	t.setLocked(api.TransferCommitted)
	t.mu.Unlock()
	a.mTransfers.WithLabelValues("in", "committed").Inc()
	if hold {
		a.mTransfers.WithLabelValues("in", "held").Inc()
		a.log.Warn("committed a moved part whose lease has no time left; not serving it until a heartbeat answer shows time left",
			"transfer", t.id, "lease", e.Request.LeaseID, "device", e.Device.Name)
		return api.TransferCommitResponse(resp), nil
	}
	a.log.Info("serving a moved part", "transfer", t.id, "lease", e.Request.LeaseID, "device", e.Device.Name)
	return api.TransferCommitResponse(resp), nil
}

// unactivate takes back what activate did for e, a part whose commit
// failed after its driver activated it; opMu is held. The part is as it
// was received again (received, the agent's entry of it, if it had one):
// not reported as the lease's, not served (the driver keeps it its
// export, suspended: a commit tried again serves it, or not, as that
// commit says), and an abort or its expiry wipes it and forgets it. Left
// recorded as served, the part was reported in the heartbeats and served
// with the transfer still receiving, and the abort that followed wiped
// its range but kept the entry: the range refused to every prepare, the
// lease reported here, and restored by a restart if it had been
// persisted. saved: the exports file lists e (written again without it).
func (a *Agent) unactivate(ctx context.Context, mv Mover, e Export, received Export, wasReceived, saved bool) {
	name := e.Request.Export
	a.mu.Lock()
	if wasReceived {
		a.exports[name] = received
	} else {
		delete(a.exports, name)
	}
	a.exportsChangedLocked()
	a.mu.Unlock()
	held := e
	held.suspended = true
	if _, err := mv.ActivateMove(context.WithoutCancel(ctx), held); err != nil {
		a.log.Warn("a moved part whose commit failed could not be suspended", "lease", e.Request.LeaseID,
			"device", e.Device.Name, "err", err)
	}
	if saved {
		// Or, if this fails too, the range's journal entry (still there)
		// makes a restart wipe the range and drop the export.
		if err := a.saveExportsLocked(); err != nil {
			a.log.Warn("a moved part whose commit failed stays in the exports file", "lease", e.Request.LeaseID,
				"device", e.Device.Name, "err", err)
		}
	}
}

// commitOut commits a sealed outgoing transfer: it retires the old
// export, tears it down and journals its range (durably: refused to every
// prepare and transfer, and wiped by a restart), and returns the wipes it
// owes, which the caller runs: in the background for the control plane's
// commit (CommitTransfer), at once for a teardown.
func (a *Agent) commitOut(ctx context.Context, t *transfer) ([]*pendingWipe, error) {
	t.mu.Lock()
	st := t.st.State
	if st == api.TransferSealed {
		// Claimed: an abort now finds it committing.
		t.setLocked(transferCommitting)
	}
	t.mu.Unlock()
	switch st {
	case api.TransferCommitted:
		return nil, nil
	case api.TransferSealed:
	default:
		return nil, fmt.Errorf("%w: it is %s, not sealed", ErrTransferState, st)
	}
	// From here on the part lives at the destination: the old export
	// never serves a write again.
	if err := t.src.Retire(ctx); err != nil {
		a.log.Warn("retiring a moved part's export did not end cleanly", "transfer", t.id, "err", err)
	}
	close(t.finish)
	<-t.done
	a.endOut(t)
	// The old export is torn down and its range journalled; the wipe is
	// the caller's. (Run within the control plane's commit, a slow wipe,
	// of a large range on a device that cannot punch holes, outlasted the
	// call's bound: the control plane recorded the move done without
	// this lender's answer.)
	name := t.e.Request.Export
	wipes, err := a.retireExports(ctx, t.e.Request.LeaseID, func(e Export) bool { return e.Request.Export == name })
	if err != nil {
		// Not journalled: the export stays (it serves nothing, retired)
		// until a teardown that can journal its wipe (the heartbeat
		// answers no longer list the part here: dropExports).
		a.log.Warn("tearing down a moved part", "transfer", t.id, "err", err)
	}
	t.setState(api.TransferCommitted)
	a.mTransfers.WithLabelValues("out", "committed").Inc()
	a.log.Info("moved part switched over; old export torn down, its range journalled for its wipe", "transfer", t.id,
		"lease", t.e.Request.LeaseID)
	return wipes, nil
}

// runWipes runs the wipes ws at once, returning their errors (each range
// that is not wiped stays in the journal, retried every heartbeat round).
func (a *Agent) runWipes(ctx context.Context, ws []*pendingWipe) error {
	var errs []error
	for _, w := range ws {
		if err := a.runWipe(ctx, w); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// wipeInBackground wipes the journalled ranges ws on a goroutine the
// agent owns (a.bg). Until a range is wiped it stays in the journal,
// refused to every prepare and transfer; a wipe that fails stays there,
// retried every heartbeat round, and one the agent's stop interrupts (or
// that the stopping agent no longer starts) is finished by the next run
// before it serves anything.
func (a *Agent) wipeInBackground(ws []*pendingWipe) {
	if len(ws) == 0 {
		return
	}
	started := a.bg.run(func(ctx context.Context) {
		for _, w := range ws {
			err := a.runWipe(ctx, w)
			switch {
			case err == nil:
			case ctx.Err() != nil:
				a.log.Info("the agent stopped during a wipe; the range stays in the journal, wiped before the next run serves anything",
					"lease", w.LeaseID, "device", w.DeviceName)
				return
			default:
				a.log.Warn("wiping a moved part's old range failed; it stays in the journal (unlendable), retried every heartbeat round", "err", err)
			}
		}
	})
	if !started {
		a.log.Info("the agent is stopping: a moved part's old range stays in the journal, wiped before the next run serves anything",
			"ranges", len(ws))
	}
}

// AbortTransfer gives a transfer up: the source serves the part as
// before, the destination stops receiving and wipes the range.
func (a *Agent) AbortTransfer(ctx context.Context, id string) (api.Transfer, error) {
	t, err := a.xfers.get(id)
	if err != nil {
		return api.Transfer{}, err
	}
	if err := a.abortTransfer(ctx, t, "aborted by the control plane", false); err != nil {
		return api.Transfer{}, err
	}
	return t.status(), nil
}

// errSealed is abortTransfer's answer, asked to spare a sealed transfer,
// for one that is sealed: it is left as it is.
var errSealed = fmt.Errorf("%w: it is sealed", ErrTransferState)

// abortTransfer gives t up (see AbortTransfer); a transfer done already
// is left as it is. With spareSealed, a sealed outgoing transfer is left
// as it is too (errSealed), judged with the state change, so that a seal
// that comes after the caller looked at the transfer is not undone: its
// held writes would be served here while the control plane goes on to
// point the lease at the destination (only the control plane, which
// knows whether it did, aborts a sealed move).
func (a *Agent) abortTransfer(ctx context.Context, t *transfer, why string, spareSealed bool) error {
	t.mu.Lock()
	st := t.st.State
	switch {
	case st == api.TransferAborted || st == api.TransferFailed:
		t.mu.Unlock()
		return nil
	case st == api.TransferCommitted || st == transferCommitting:
		t.mu.Unlock()
		return fmt.Errorf("%w: it is %s", ErrTransferState, st)
	case spareSealed && st == api.TransferSealed:
		t.mu.Unlock()
		return errSealed
	}
	t.st.Error = why
	t.setLocked(api.TransferAborted)
	// An incoming transfer ReceiveTransfer has not set up yet (its part
	// is not known): it finds the transfer aborted and undoes its work.
	receiving := t.role == "in" && t.e.Request.Export == ""
	t.mu.Unlock()
	if t.role == "out" {
		t.mu.Lock()
		cancel := t.cancel
		t.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		close(t.finish)
		<-t.done
		a.endOut(t)
		a.mTransfers.WithLabelValues("out", "aborted").Inc()
		a.log.Info("move aborted; the part is served here as before", "transfer", t.id, "lease", t.e.Request.LeaseID, "why", why)
		return nil
	}
	a.mTransfers.WithLabelValues("in", "aborted").Inc()
	if receiving {
		a.log.Info("move aborted while its part was being set up here; it is undone", "transfer", t.id, "why", why)
		return nil
	}
	a.log.Info("move aborted; wiping the received range", "transfer", t.id, "lease", t.e.Request.LeaseID, "why", why)
	return a.dropIncoming(ctx, t)
}

// dropIncoming stops receiving t's range and wipes it.
func (a *Agent) dropIncoming(ctx context.Context, t *transfer) error {
	t.mu.Lock()
	e, w := t.e, t.wipe
	t.mu.Unlock()
	a.opMu.Lock()
	drv := a.drivers[e.Device.Kind]
	err := drv.Teardown(ctx, e)
	a.mu.Lock()
	if cur, ok := a.exports[e.Request.Export]; ok && cur.incoming {
		delete(a.exports, e.Request.Export)
		a.exportsChangedLocked()
	}
	a.mu.Unlock()
	a.opMu.Unlock()
	if err != nil {
		return fmt.Errorf("agent: stop receiving: %w", err)
	}
	if w != nil {
		a.mu.Lock()
		w.live = false
		a.mu.Unlock()
		return a.runWipe(ctx, w)
	}
	return nil
}

// abortLeaseTransfers aborts the transfers of a lease (it is being torn
// down, or stops being served here). A sealed outgoing transfer is not
// aborted (that would serve the held writes here, while the lease may
// already point at the destination): torn down, it is committed — the
// export retired, torn down and wiped, as the teardown would anyway;
// stopped at expiry (teardown false), it is left to the control plane.
// Stopped at expiry, only the moves from here are aborted: a part moving
// here serves the borrower nothing until its commit (which brings the
// lease's expiry), and its own expiry bounds it; aborting it would hold
// the stop back for the wipe of its range.
func (a *Agent) abortLeaseTransfers(ctx context.Context, leaseID, why string, teardown bool) {
	for _, t := range a.xfers.list() {
		if !teardown && t.role != "out" {
			continue
		}
		st := t.status()
		if st.LeaseID != leaseID || st.Done() {
			continue
		}
		switch err := a.abortTransfer(ctx, t, why, true); {
		case errors.Is(err, errSealed):
			if teardown {
				wipes, err := a.commitOut(ctx, t)
				if err == nil {
					err = a.runWipes(ctx, wipes)
				}
				if err != nil {
					a.log.Warn("committing a sealed transfer of a lease torn down", "transfer", t.id, "err", err)
				}
			}
		case err != nil:
			a.log.Warn("aborting a transfer", "transfer", t.id, "err", err)
		}
	}
}

// expireTransfers gives up the incoming transfers past their expiry and
// forgets transfers finished long ago (every heartbeat round).
func (a *Agent) expireTransfers(ctx context.Context) {
	now := a.clock.Now()
	for _, t := range a.xfers.list() {
		st := t.status()
		if t.role == "in" && st.State == api.TransferReceiving && !now.Before(t.expires) {
			if err := a.abortTransfer(ctx, t, "expired before it was committed", false); err != nil {
				a.log.Warn("expiring a transfer", "transfer", t.id, "err", err)
			}
			continue
		}
		if st.Done() && time.Since(st.UpdatedAt) > keepDone {
			a.xfers.mu.Lock()
			delete(a.xfers.m, t.id)
			a.xfers.mu.Unlock()
		}
	}
}

// nextTransferExpiry is the earliest expiry of an incoming transfer.
func (a *Agent) nextTransferExpiry() (time.Time, bool) {
	var next time.Time
	for _, t := range a.xfers.list() {
		if t.role == "in" && t.status().State == api.TransferReceiving && (next.IsZero() || t.expires.Before(next)) {
			next = t.expires
		}
	}
	return next, !next.IsZero()
}

// transferRoutes adds the transfer API to mux (bearer agent key):
//
//	POST /agent/v1/transfers/in          TransferInRequest → TransferInResponse
//	POST /agent/v1/transfers/out         TransferOutRequest → Transfer (202)
//	GET  /agent/v1/transfers             [Transfer]
//	GET  /agent/v1/transfers/{id}        Transfer (?while=STATE: once it is no longer in STATE, or after a second)
//	POST /agent/v1/transfers/{id}/seal   Transfer (source)
//	POST /agent/v1/transfers/{id}/commit TransferCommitRequest → TransferCommitResponse
//	POST /agent/v1/transfers/{id}/abort  Transfer
func (a *Agent) transferRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /agent/v1/transfers/in", a.auth(func(w http.ResponseWriter, r *http.Request) {
		var req api.TransferInRequest
		if !decodeBody(w, r, &req) {
			return
		}
		resp, err := a.ReceiveTransfer(r.Context(), req)
		a.answer(w, r, http.StatusOK, resp, err)
	}))
	mux.HandleFunc("POST /agent/v1/transfers/out", a.auth(func(w http.ResponseWriter, r *http.Request) {
		var req api.TransferOutRequest
		if !decodeBody(w, r, &req) {
			return
		}
		resp, err := a.SendTransfer(r.Context(), req)
		a.answer(w, r, http.StatusAccepted, resp, err)
	}))
	mux.HandleFunc("GET /agent/v1/transfers", a.auth(func(w http.ResponseWriter, r *http.Request) {
		a.answer(w, r, http.StatusOK, a.Transfers(), nil)
	}))
	mux.HandleFunc("GET /agent/v1/transfers/{id}", a.auth(func(w http.ResponseWriter, r *http.Request) {
		// ?while=STATE waits until the transfer leaves STATE, or a
		// second (the counters move meanwhile: a caller following the
		// copy sees them at least that often).
		if from := r.URL.Query().Get("while"); from != "" {
			t, err := a.xfers.get(r.PathValue("id"))
			if err != nil {
				a.answer(w, r, 0, nil, err)
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), statusWait)
			defer cancel()
			a.answer(w, r, http.StatusOK, t.waitChange(ctx, from), nil)
			return
		}
		resp, err := a.Transfer(r.PathValue("id"))
		a.answer(w, r, http.StatusOK, resp, err)
	}))
	mux.HandleFunc("POST /agent/v1/transfers/{id}/seal", a.auth(func(w http.ResponseWriter, r *http.Request) {
		resp, err := a.SealTransfer(r.Context(), r.PathValue("id"))
		a.answer(w, r, http.StatusOK, resp, err)
	}))
	mux.HandleFunc("POST /agent/v1/transfers/{id}/commit", a.auth(func(w http.ResponseWriter, r *http.Request) {
		// No body, or an empty one (an older control plane's): no
		// expiry. Fields this agent does not know are ignored (the
		// control plane may be newer).
		var req api.TransferCommitRequest
		if err := httpx.DecodeJSONTolerant(w, r, maxBody, &req); err != nil && !errors.Is(err, httpx.ErrEmptyBody) {
			httpx.WriteError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
			return
		}
		resp, err := a.CommitTransfer(r.Context(), r.PathValue("id"), req)
		a.answer(w, r, http.StatusOK, resp, err)
	}))
	mux.HandleFunc("POST /agent/v1/transfers/{id}/abort", a.auth(func(w http.ResponseWriter, r *http.Request) {
		resp, err := a.AbortTransfer(r.Context(), r.PathValue("id"))
		a.answer(w, r, http.StatusOK, resp, err)
	}))
}

// decodeBody decodes a JSON request body into v strictly
// (httpx.DecodeJSON), answering 400 if it cannot.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := httpx.DecodeJSON(w, r, maxBody, v); err != nil {
		httpx.WriteError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return false
	}
	return true
}

// answer writes v with status, or err as answerError does.
func (a *Agent) answer(w http.ResponseWriter, r *http.Request, status int, v any, err error) {
	if err != nil {
		a.answerError(w, r, err)
		return
	}
	httpx.WriteJSON(w, status, v)
}
