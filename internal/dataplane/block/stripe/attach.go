package stripe

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pki"
)

// DefaultRedialTimeout is the longest Attach redials a part by default.
const DefaultRedialTimeout = 10 * time.Second

// DefaultConnsPerPart is the number of NBD connections Attach opens to each
// part when AttachConfig leaves it 0.
const DefaultConnsPerPart = 2

// AttachConfig describes a composed volume to attach.
type AttachConfig struct {
	// URIs are the parts, in layout order, as nbd:// or nbd+unix:// URIs,
	// or their TLS forms nbds:// and nbds+unix://. The export name in each
	// is the lease credential: it is never logged.
	URIs []string
	// TLS, if set, returns the client configuration for the parts whose
	// URI asks for TLS (normally one that trusts the cluster CA's
	// certificates: pki.LoadClientTLS, pki.Roots.ClientTLS). It is called
	// at each dial, a broken part's redials included, so that the CA
	// certificates it trusts may change while the volume is attached (a
	// `rialto attach` following a CA rotation). Nil uses each URI's
	// tls-certificates directory, else the system's CAs. Parts with a
	// plaintext URI ignore it.
	TLS func() *tls.Config
	// Track, if set, is handed each TLS connection to a part, the
	// redials' too (nbd.WithTrack): normally the Tracker of the
	// revocation list TLS's configurations check (pki.Roots.Tracker),
	// which ends a connection once a list it takes later revokes the
	// lender's certificate. The part's redial then fails the handshake,
	// and the part is not redialled further unless Resolve moves it to
	// another lender (see nbdPart.reconnect).
	Track pki.TrackFunc
	// StripeUnit as in Config; 0 means DefaultStripeUnit.
	StripeUnit int64
	// Listen is where the composed volume is served: a TCP address
	// ("127.0.0.1:0", the default) or "unix:/path/to/socket".
	Listen string
	// ExportName is the name of the local export; empty means a random
	// 128-bit name, so other local users cannot guess the URI.
	ExportName string
	// ConnsPerPart is the number of connections to each part; 0 means
	// DefaultConnsPerPart.
	ConnsPerPart int
	// RequestTimeout bounds every request to a part; 0 means
	// DefaultRequestTimeout. A part that misses it is declared failed.
	RequestTimeout time.Duration
	// RedialTimeout bounds how long a broken connection to a part (the
	// lender closed it, e.g. because it restarted) is redialled before the
	// request that found it broken fails; 0 means DefaultRedialTimeout or
	// half of RequestTimeout, whichever is shorter; negative disables
	// redialling.
	RedialTimeout time.Duration
	// Resolve, if set, gives a part's current URI (part in layout order).
	// While redialling a broken part fails, Attach asks it before each new
	// attempt and dials what it answers: a lender that restarted with the
	// part's port taken serves it at another address, which the control
	// plane learns from its heartbeat (`rialto attach` asks the control
	// plane for the lease). nil redials the URI the part was attached with.
	Resolve func(ctx context.Context, part int) (string, error)
	// Workers is as in ServeConfig.
	Workers int
	// WriteBack is as in ServeConfig.
	WriteBack bool
	// Logger receives attachment events; nil discards.
	Logger *slog.Logger
}

// dialTLS is the client configuration of tlsFor (AttachConfig.TLS) for
// one dial: nil without it.
func dialTLS(tlsFor func() *tls.Config) *tls.Config {
	if tlsFor == nil {
		return nil
	}
	return tlsFor()
}

// Attachment is a composed volume served as a local NBD export.
type Attachment struct {
	vol    *Volume
	wb     *writeBack // nil: writes are synchronous
	rep    *untold
	srv    *nbd.Server
	ln     net.Listener
	uri    string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // from Serve, valid after done
	once   sync.Once
	sock   string // Unix socket path to remove
	// closeVol closes the volume once: Close, or its timer (settle).
	closeVol sync.Once
	volErr   error // of the volume's Close, valid after closeVol
}

// Attach dials every part (ConnsPerPart connections each, concurrently),
// builds the Volume and serves it with an nbd.Server until Close. ctx bounds
// the dialing only.
func Attach(ctx context.Context, cfg AttachConfig) (*Attachment, error) {
	vol, err := Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	a, err := Serve(ctx, vol, ServeConfig{Listen: cfg.Listen, ExportName: cfg.ExportName, Workers: cfg.Workers,
		WriteBack: cfg.WriteBack, Logger: cfg.Logger})
	if err != nil {
		vol.Close()
		return nil, err
	}
	return a, nil
}

// Dial dials every part as Attach does (a pool of connections per part,
// each redialled when broken) and returns the Volume, not served: the
// caller serves it some other way (a FUSE file) and closes it. Listen,
// ExportName, Workers and WriteBack are ignored. Open is the lighter form
// for short direct use.
func Dial(ctx context.Context, cfg AttachConfig) (*Volume, error) {
	if len(cfg.URIs) == 0 {
		return nil, fmt.Errorf("%w: no parts", ErrConfig)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	conns := cfg.ConnsPerPart
	if conns <= 0 {
		conns = DefaultConnsPerPart
	}
	timeout := cfg.RequestTimeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	redial := cfg.RedialTimeout
	if redial == 0 {
		redial = min(DefaultRedialTimeout, timeout/2)
	}
	redial = max(redial, 0)
	uris := make([]nbd.URI, len(cfg.URIs))
	for i, s := range cfg.URIs {
		u, err := nbd.ParseURI(s)
		if err != nil {
			// The URI holds a credential and url.Parse errors quote the
			// input: say only which part is malformed.
			return nil, fmt.Errorf("%w: part %d: malformed NBD URI", ErrConfig, i)
		}
		uris[i] = u
	}

	clients := make([][]*nbd.Client, len(uris))
	for i := range clients {
		clients[i] = make([]*nbd.Client, conns)
	}
	errs := make([]error, len(uris)*conns)
	var wg sync.WaitGroup
	for i, u := range uris {
		for j := range conns {
			wg.Go(func() {
				c, err := u.Dial(ctx, dialTLS(cfg.TLS), nbd.WithRequestTimeout(timeout), nbd.WithTrack(cfg.Track))
				if err != nil {
					errs[i*conns+j] = fmt.Errorf("stripe: part %d (%s): %w", i, u.Address, err)
					return
				}
				clients[i][j] = c
			})
		}
	}
	wg.Wait()
	closeAll := func() {
		for _, cs := range clients {
			for _, c := range cs {
				if c != nil {
					c.Close()
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		closeAll()
		return nil, err
	}
	devs := make([]Device, len(uris))
	for i, cs := range clients {
		if len(cs) == 1 {
			devs[i] = newPart(cs[0], uris[i], cfg.TLS, cfg.Track, i, timeout, redial, cfg.Resolve, log)
			continue
		}
		ps := make([]Device, len(cs))
		for j, c := range cs {
			ps[j] = newPart(c, uris[i], cfg.TLS, cfg.Track, i, timeout, redial, cfg.Resolve, log)
		}
		p, err := NewPool(ps...)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("stripe: part %d: %w", i, err)
		}
		devs[i] = p
	}
	vol, err := New(devs, Config{StripeUnit: cfg.StripeUnit, RequestTimeout: timeout, Logger: log})
	if err != nil {
		closeAll()
		return nil, err
	}
	log.Info("stripe: attached", "parts", len(uris), "conns_per_part", conns, "stripe_unit", vol.StripeUnit(), "size", vol.Size())
	return vol, nil
}

// DefaultWorkers is the number of requests the local export serves
// concurrently per client connection. It is higher than nbd.Server's default
// because a striped request completes only when its slowest part has, so
// more requests must be in flight to keep every part's link busy.
const DefaultWorkers = 64

// ServeConfig says where Serve exports a volume.
type ServeConfig struct {
	Listen     string // as AttachConfig.Listen
	ExportName string // as AttachConfig.ExportName
	Workers    int    // requests served concurrently per connection; 0 means DefaultWorkers
	// WriteBack acknowledges a plain write (no FUA, at most 1 MiB) once
	// it has been sent to its lenders, before their replies: a volatile
	// write cache that FLUSH and FUA make durable (see writeBack). Off by
	// default: it measured no clear gain under PostgreSQL
	// (docs/bench/pgbench.md) and costs CPU. Ignored for a volume whose
	// devices cannot send a write without awaiting it (not built by
	// Attach).
	WriteBack bool
	Logger    *slog.Logger

	// wrapListener, if set, wraps the listener (for tests).
	wrapListener func(net.Listener) net.Listener
}

// Serve exports an existing volume over NBD; the Attachment owns vol and
// closes it on Close. Attach uses it; tests and other callers can serve a
// Volume built with New.
func Serve(ctx context.Context, vol *Volume, cfg ServeConfig) (*Attachment, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	name := cfg.ExportName
	if name == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("stripe: export name: %w", err)
		}
		name = hex.EncodeToString(b[:])
	}
	listen := cfg.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	var (
		ln   net.Listener
		err  error
		uri  nbd.URI
		sock string
	)
	if path, ok := strings.CutPrefix(listen, "unix:"); ok {
		ln, err = (&net.ListenConfig{}).Listen(ctx, "unix", path)
		if err == nil {
			sock = path
			err = os.Chmod(path, 0o600)
		}
		uri = nbd.URI{Network: "unix", Address: path, Export: name}
	} else {
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", listen)
		if err == nil {
			uri = nbd.URI{Network: "tcp", Address: ln.Addr().String(), Export: name}
		}
	}
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("stripe: listen: %w", err)
	}
	if cfg.wrapListener != nil {
		ln = cfg.wrapListener(ln)
	}
	b := backend{v: vol, startsWrites: vol.startsWrites(), rep: &untold{}}
	if cfg.WriteBack {
		b.wb = newWriteBack(vol)
	}
	var be nbd.Backend = b
	if vol.CanTrim() {
		be = trimBackend{b}
	}
	workers := cfg.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	srv := &nbd.Server{Logger: log, Workers: workers}
	if err := srv.AddExport(nbd.Export{Name: name, Description: fmt.Sprintf("rialto striped volume, %d parts", vol.Devices()), Backend: be}); err != nil {
		ln.Close()
		return nil, fmt.Errorf("stripe: export: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	a := &Attachment{vol: vol, wb: b.wb, rep: b.rep, srv: srv, ln: ln, uri: uri.String(), cancel: cancel, done: make(chan struct{}), sock: sock}
	go func() {
		defer close(a.done)
		a.err = srv.Serve(sctx, ln)
	}()
	return a, nil
}

// URI is the nbd:// (or nbd+unix://) URI any NBD client can use. It contains
// the local export name: treat it as a secret.
func (a *Attachment) URI() string { return a.uri }

// Volume is the composed volume.
func (a *Attachment) Volume() *Volume { return a.vol }

// WriteBack reports whether plain writes are acknowledged before their
// lenders' replies (ServeConfig.WriteBack on a volume that allows it).
func (a *Attachment) WriteBack() bool { return a.wb != nil }

// Close ends the attachment as qemu-nbd ends on exit: it stops accepting
// and drops the client connections, refuses new writes, waits until every
// write under way has been answered by its lenders (acknowledged early
// with write-back, or not yet: a write answered as the connections drop
// may still reach its client, so it must be in the flush), flushes every
// part that has writes no flush covered (a failed part does not keep the
// others from being flushed), then closes the parts and removes the Unix
// socket, if any. Waiting and flushing take at most the request timeout
// (AttachConfig.RequestTimeout): past it the parts are closed, which
// fails what their lenders have not answered (and a write they answer
// after it: none is acknowledged then), and Close's error wraps
// ErrTimeout. Parts whose completed writes no flush covered (the deadline
// passed, or their flush failed) are named with ErrUnflushed: a write
// acknowledged to a client is covered by Close's flush or named there.
// Close reports what a FLUSH
// that began with it would: an acknowledged write that failed
// (ErrWriteBack) or writes a lender's restart may have lost
// (ErrLostWrites) that no FLUSH reported, and its flush's failure; a
// report that a FLUSH took but whose reply never reached its client (see
// untold), each report once; and errors of serving or closing.
func (a *Attachment) Close() error { return a.CloseContext(context.Background()) }

// CloseContext is Close, whose wait for the writes not yet acknowledged
// also ends with ctx: when ctx ends before they are answered, they fail,
// unacknowledged, whatever their lenders answer later (they are closed
// with the parts), and Close reports how many, wrapping ctx's error. What
// was acknowledged keeps the request timeout: the write-back cache's
// writes in flight and Close's flush (a lender that hangs with a write
// acknowledged early, or with writes to flush, still holds Close until
// then). So a write stuck on a hung lender holds Close no longer than ctx
// allows, unless its part has acknowledged writes to make durable.
func (a *Attachment) CloseContext(ctx context.Context) error {
	err := ErrClosed
	a.once.Do(func() {
		a.cancel()
		serr := a.settle(ctx)
		// Requests still blocked on a vanished lender (reads) return at
		// once when the parts close, instead of after RequestTimeout.
		a.closeVolume()
		<-a.done
		err = errors.Join(serr, a.err, a.volErr)
		// Every reply has been sent, or never will be. A report that
		// Close took as well as a FLUSH whose reply was lost (both were
		// under way when it was found) is listed once.
		if kept := missing(a.rep.take(), reportsIn(serr, nil)); kept != nil {
			err = errors.Join(err, fmt.Errorf("%w: %w", errUntold, errors.Join(asErrors(kept)...)))
		}
		if a.sock != "" {
			if rerr := os.Remove(a.sock); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				err = errors.Join(err, rerr)
			}
		}
	})
	return err
}

// settle is Close's wait for the writes acknowledged early and the other
// writes under way, and its flush (Volume.settle), under one timer of the
// request timeout that closes the volume.
func (a *Attachment) settle(ctx context.Context) error {
	if a.wb == nil {
		return a.vol.settle(ctx, nil, a.closeVolume)
	}
	seen := a.wb.close()
	return a.vol.settle(ctx, func() error { return a.wb.settle(seen) }, a.closeVolume)
}

// closeVolume closes the volume once (Close, or settle's timer); volErr
// holds the outcome.
func (a *Attachment) closeVolume() {
	a.closeVol.Do(func() { a.volErr = a.vol.Close() })
}

// backend exposes a Volume as an nbd.Backend, nbd.Zeroer and
// nbd.FUAWriter, through its write-back cache if it has one; trimBackend
// adds nbd.Trimmer, so that the export advertises trim only when every part
// can trim.
type backend struct {
	v  *Volume
	wb *writeBack // nil: every write waits for its lenders
	// startsWrites: every part can send a write and hear of it later and
	// bounds its requests itself (StartWriteAt).
	startsWrites bool
	rep          *untold
}

// untold keeps the failure reports (ErrWriteBack, ErrLostWrites) that a
// FLUSH of the local export took and whose reply never reached its client
// (nbd.ReplyWatcher: the connection ended, or its send failed, first). A
// report a FLUSH takes is not reported to the FLUSHes that begin after it
// (errseq), so that one, which nobody heard, is left here: the next FLUSH
// to end reports it, and so does Close. A report counts as told once the
// reply carrying it has been written whole to the client's socket, as the
// server counts it: a reply written by a send that failed after it is
// counted not sent, and its reports are given again (told twice). A report
// is kept once, however many FLUSHes took it (lossReport).
type untold struct {
	n    atomic.Int32 // len(reps), read without mu by every FLUSH
	mu   sync.Mutex
	reps []*lossReport

	// For tests: called when a FLUSH has its outcome, before it returns
	// it (atomic: set while the export serves).
	flushed atomic.Pointer[func()]
}

// errUntold introduces the reports untold gives back.
var errUntold = errors.New("stripe: reported to a FLUSH whose reply did not reach its client")

// take returns the reports kept (nil if none) and forgets them.
func (u *untold) take() []*lossReport {
	if u.n.Load() == 0 {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	reps := u.reps
	u.reps = nil
	u.n.Store(0)
	return reps
}

// keep keeps reports whose reply was not sent, those it lacks.
func (u *untold) keep(reps []*lossReport) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.reps = append(u.reps, missing(reps, u.reps)...)
	u.n.Store(int32(len(u.reps)))
}

// flushReport is a FLUSH's error that carries failure reports: own, what
// its flush took, and carried, reports untold gave back to it. If its reply
// is not sent, they go back to untold.
type flushReport struct {
	err     error // what the FLUSH returns
	reports []*lossReport
	u       *untold
}

func (r *flushReport) Error() string { return r.err.Error() }
func (r *flushReport) Unwrap() error { return r.err }

// ReplySent implements nbd.ReplyWatcher.
func (r *flushReport) ReplySent(sent bool) {
	if !sent {
		r.u.keep(r.reports)
	}
}

// reportFlush returns what a FLUSH of the local export whose flush
// returned err answers: err, with the reports untold kept that err lacks,
// wrapped so that its reports are kept again if its reply is not sent.
func (u *untold) reportFlush(err error) error {
	reports := reportsIn(err, nil)
	if kept := missing(u.take(), reports); kept != nil {
		reports = append(reports, kept...)
		err = errors.Join(err, fmt.Errorf("%w: %w", errUntold, errors.Join(asErrors(kept)...)))
	}
	if f := u.flushed.Load(); f != nil {
		(*f)()
	}
	if reports == nil {
		return err
	}
	return &flushReport{err: err, reports: reports, u: u}
}

func (b backend) ReadAt(p []byte, off int64) (int, error) {
	if b.wb != nil {
		b.wb.order(off, int64(len(p)))
	}
	return b.v.ReadAt(p, off)
}

// StartReadAt implements nbd.ReadStarter: at queue depth above 1 the local
// export's reader sends a read within one stripe unit straight to its part,
// and the part's reply goes back through the export's sender, with no
// worker in between. Not with a write-back cache (a read waits for the
// unanswered writes it overlaps).
func (b backend) StartReadAt(p []byte, off int64, done func(error)) bool {
	if b.wb != nil || !b.v.startRead(p, off, done) {
		return false
	}
	startedReads.Add(1)
	return true
}

// startedReads and startedWrites count the requests the local export
// started on the parts (StartReadAt, StartWriteAt; for tests).
var startedReads, startedWrites atomic.Int64

// maxStartedWrite is the largest write StartWriteAt starts. A started
// write's payload is sent to its parts by the local export's reader, one
// request after another; larger writes go to the workers, which send their
// payloads in parallel: with every write started, 1 MiB writes at QD32 on
// a 3-way composed lease fell from 0.69–0.74× to 0.60–0.65× nbdkit (three
// interleaved pairs, 2026-11-26), while 4 KiB writes gained.
const maxStartedWrite = 64 << 10

// StartWriteAt implements nbd.WriteStarter as StartReadAt does for reads,
// for writes of at most maxStartedWrite bytes: the write is answered once
// its lenders have answered (a FLUSH after the reply covers it). Not with a
// write-back cache, which answers writes itself, nor on parts that cannot
// send a write and hear of it later.
func (b backend) StartWriteAt(p []byte, off int64, done func(error)) bool {
	if b.wb != nil || !b.startsWrites || len(p) > maxStartedWrite {
		return false
	}
	startedWrites.Add(1)
	b.v.startWrite(p, off, false, done)
	return true
}

func (b backend) WriteAt(p []byte, off int64) (int, error) {
	if b.wb != nil {
		return b.wb.WriteAt(p, off)
	}
	return b.v.WriteAt(p, off)
}

// WriteAtFUA writes p and waits for its lenders, then flushes the volume
// (what the server does for a FUA write without this method). FUA promises
// only this write's durability: the flush neither waits for the
// write-back cache's writes in flight nor takes the report of one that
// failed, which is the next FLUSH's (see writeBack); a loss of writes it
// finds is reported to the next FLUSH too (Volume.flushFUA).
func (b backend) WriteAtFUA(p []byte, off int64) (int, error) {
	if b.wb != nil {
		b.wb.order(off, int64(len(p)))
	}
	n, err := b.v.WriteAt(p, off)
	if err != nil {
		return n, err
	}
	return n, b.v.flushFUA()
}

// FlushFUA is the flush after a FUA TRIM or WRITE_ZEROES: as in
// WriteAtFUA, it leaves a write-back failure, and a loss of writes, to
// the next FLUSH.
func (b backend) FlushFUA() error { return b.v.flushFUA() }

func (b backend) Size() int64 { return b.v.Size() }

func (b backend) Flush() error {
	var err error
	if b.wb != nil {
		err = b.wb.Flush()
	} else {
		err = b.v.Flush()
	}
	return b.rep.reportFlush(err)
}

func (b backend) WriteZeroes(off, n int64, noHole bool) error {
	if b.wb != nil {
		b.wb.order(off, n)
	}
	return b.v.WriteZeroes(off, n, noHole)
}

// Extents passes block-status queries through to the parts (everything is
// data unless every part offers base:allocation).
func (b backend) Extents(off, n int64) ([]nbd.Extent, error) {
	if b.wb != nil {
		b.wb.order(off, n)
	}
	return b.v.Extents(off, n)
}

type trimBackend struct{ backend }

func (b trimBackend) Trim(off, n int64) error {
	if b.wb != nil {
		b.wb.order(off, n)
	}
	return b.v.Trim(off, n)
}

var (
	_ nbd.Backend    = backend{}
	_ nbd.Zeroer     = backend{}
	_ nbd.FUAWriter  = backend{}
	_ nbd.FUAFlusher = backend{}
	_ asyncWriter    = (*nbdPart)(nil)
	_ asyncWriter    = (*Pool)(nil)
	_ nbd.Extenter   = backend{}
	_ Extenter       = (*nbdPart)(nil)
	_ Extenter       = (*Pool)(nil)
	_ nbd.Trimmer    = trimBackend{}
	_ Device         = (*nbdPart)(nil)
	_ Trimmer        = (*nbdPart)(nil)
	_ Zeroer         = (*nbdPart)(nil)
)
