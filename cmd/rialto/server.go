package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/pki"
)

func init() {
	register(&command{Name: "server", Summary: "Run the control plane (REST API under /v1/; SQLite state, or PostgreSQL shared by several replicas).", Flags: runServer})
}

// timings are the control plane's liveness and lease durations.
type timings struct {
	heartbeat, suspect, down, prepare, ttl time.Duration
	maxBeats                               float64
}

func (tm *timings) register(fs *pflag.FlagSet) {
	fs.DurationVar(&tm.heartbeat, "heartbeat", time.Second, "heartbeat interval asked of agents; also the sweep interval")
	fs.DurationVar(&tm.suspect, "suspect-after", 3*time.Second, "silence after which a node is suspect")
	fs.DurationVar(&tm.down, "down-after", 10*time.Second, "silence after which a node is down and its leases lost (grace period)")
	fs.DurationVar(&tm.prepare, "prepare-timeout", 2*time.Second, "how long a lender may take to confirm a reservation")
	fs.DurationVar(&tm.ttl, "default-ttl", time.Hour, "lease TTL when the request names none")
	fs.Float64Var(&tm.maxBeats, "max-heartbeats-per-second", 100, "cap on all agents' heartbeats: past it each agent is told a longer interval, and --suspect-after and --down-after stretch alike (docs/operations.md; negative: no cap)")
}

// tokenSource is where tenant tokens come from, for a refusal to name:
// a token file (whose lines it numbers, from firstLine: the lines trimmed
// before the text) or RIALTO_TOKENS (whose comma-separated entries it
// numbers).
type tokenSource struct {
	name      string // "--token-file FILE" or "RIALTO_TOKENS"
	file      bool
	firstLine int
}

// tokensFrom is the source of the tenant tokens s holds.
func tokensFrom(s *secret) tokenSource {
	if s.file == "" {
		return tokenSource{name: s.env}
	}
	return tokenSource{name: "--" + s.name + "-file " + s.file, file: true, firstLine: 1 + s.leadingLines}
}

// parseTokens parses TOKEN:TENANT[:admin] specs, one a line or separated
// by commas. A spec that does not parse is named by its line (a file's)
// or entry number, never by its text: it holds a token.
func parseTokens(src tokenSource, text string) ([]controlplane.Token, error) {
	var out []controlplane.Token
	entry := 0
	for i, line := range strings.Split(text, "\n") {
		specs := strings.Split(line, ",")
		for j, one := range specs {
			one = strings.TrimSpace(one)
			if one == "" {
				continue
			}
			entry++
			// "tok : acme" is tok of acme: a space around a part is
			// not the token's (a client never sends it) nor the tenant's.
			parts := strings.Split(one, ":")
			for k := range parts {
				parts[k] = strings.TrimSpace(parts[k])
			}
			if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" || (len(parts) == 3 && parts[2] != "admin") {
				where := fmt.Sprintf("entry %d", entry)
				if src.file {
					where = fmt.Sprintf("line %d", src.firstLine+i)
					if len(specs) > 1 {
						where += fmt.Sprintf(", entry %d", j+1)
					}
				}
				return nil, fmt.Errorf("%s: %s: bad token spec (want TOKEN:TENANT or TOKEN:TENANT:admin, one a line, no comments; the text is not shown: it holds a token)", src.name, where)
			}
			out = append(out, controlplane.Token{Token: parts[0], Tenant: parts[1], Admin: len(parts) == 3})
		}
	}
	return out, nil
}

// apiStopTimeout bounds how long a stopping control plane lets the
// requests its API is serving finish and answer (a lease creation waits
// for its lenders' prepares: --prepare-timeout).
const apiStopTimeout = 5 * time.Second

// controlPlane is a running control plane: its HTTP server and sweeper.
type controlPlane struct {
	URL   string
	srv   *controlplane.Server
	st    store.Store
	lock  *os.File // a SQLite database's lock (lockSQLite); nil with PostgreSQL
	hs    *http.Server
	conns *httpx.Conns // hs's connections serving a request
	log   *slog.Logger
	done  chan error
	sweep context.CancelFunc
	swept chan struct{}
}

// startControlPlane opens the store, builds the server and serves it on
// ln, over HTTPS when tlsCfg is set (else plain HTTP). Sweeping starts with
// startSweeping.
func startControlPlane(ctx context.Context, ln net.Listener, db string, cfg controlplane.Config, tlsCfg *tls.Config) (*controlPlane, error) {
	lock, err := lockSQLite(db)
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, db)
	if err != nil {
		closeLock(lock)
		return nil, err
	}
	cfg.Store = st
	srv, err := controlplane.New(ctx, cfg)
	if err != nil {
		st.Close()
		closeLock(lock)
		return nil, err
	}
	cp := &controlPlane{
		URL: "http://" + ln.Addr().String(), srv: srv, st: st, lock: lock, done: make(chan error, 1), conns: &httpx.Conns{}, log: cfg.Logger,
	}
	// ReadHeaderTimeout bounds the headers, Config.BodyTimeout the body
	// (a ReadTimeout would end the event streams too); IdleTimeout closes
	// keep-alive connections left idle.
	cp.hs = &http.Server{Handler: srv.Handler(), ConnState: cp.conns.Track, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug), TLSConfig: tlsCfg}
	cp.hs.RegisterOnShutdown(srv.CloseStreams) // event streams never go idle
	if tlsCfg != nil {
		cp.URL = "https://" + ln.Addr().String()
		go func() { cp.done <- cp.hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { cp.done <- cp.hs.Serve(ln) }()
	}
	return cp, nil
}

// advertiseURL is the API address other replicas reach this one by: the
// listening address, or the host name when it listens on every address.
func advertiseURL(addr net.Addr, https bool) string {
	scheme := "http://"
	if https {
		scheme = "https://"
	}
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return scheme + addr.String()
	}
	if ta.IP.IsUnspecified() {
		if hn, err := os.Hostname(); err == nil && hn != "" {
			return scheme + net.JoinHostPort(hn, strconv.Itoa(ta.Port))
		}
	}
	return scheme + ta.String()
}

// apiTLS opens the cluster CA in dir, creating it if absent, and returns it
// with the API's server TLS configuration: a certificate for the hosts
// clients may reach ln by (see apiHosts), issued from the CA and renewed
// before it expires.
func apiTLS(dir, listen string, ln net.Listener, extra []string) (*pki.CA, *tls.Config, error) {
	ca, err := pki.Open(dir, pki.Options{})
	if err != nil {
		return nil, nil, err
	}
	cfg, err := controlplane.APIServerTLS(ca, apiHosts(listen, ln.Addr(), extra))
	if err != nil {
		return nil, nil, err
	}
	return ca, cfg, nil
}

// apiHosts are the names the API's certificate carries: the address it
// listens on (every local address, the host name and localhost when that
// is a wildcard; localhost too on loopback), the host name given to
// --listen, and extra.
func apiHosts(listen string, addr net.Addr, extra []string) []string {
	var hosts []string
	if h, _, err := net.SplitHostPort(listen); err == nil && h != "" && net.ParseIP(h) == nil {
		hosts = append(hosts, h)
	}
	if ta, ok := addr.(*net.TCPAddr); ok {
		switch {
		case ta.IP.IsUnspecified():
			if as, err := net.InterfaceAddrs(); err == nil {
				for _, a := range as {
					if ipn, ok := a.(*net.IPNet); ok {
						hosts = append(hosts, ipn.IP.String())
					}
				}
			}
			if hn, err := os.Hostname(); err == nil && hn != "" {
				hosts = append(hosts, hn)
			}
			hosts = append(hosts, "localhost")
		case ta.IP.IsLoopback():
			hosts = append(hosts, ta.IP.String(), "localhost")
		default:
			hosts = append(hosts, ta.IP.String())
		}
	}
	hosts = append(hosts, extra...)
	seen := map[string]bool{}
	out := hosts[:0]
	for _, h := range hosts {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

func (cp *controlPlane) url() string { return cp.URL }

// startSweeping runs the background duties (liveness, expiry).
func (cp *controlPlane) startSweeping(ctx context.Context) {
	ctx, cp.sweep = context.WithCancel(ctx)
	cp.swept = make(chan struct{})
	go func() {
		defer close(cp.swept)
		cp.srv.Run(ctx)
	}()
}

// stop shuts the control plane down and waits for its goroutines: the
// API takes no new request, the requests under way get their answers (for
// at most apiStopTimeout), and the connections clients keep idle (every
// agent's, HTTP/2) are closed without waiting for the clients to hang up
// (httpx.Conns.Stop).
func (cp *controlPlane) stop() error {
	start := time.Now()
	if cp.sweep != nil {
		cp.sweep()
		<-cp.swept
	}
	cp.srv.Close() // moves and drains under way are given up
	sctx, cancel := context.WithTimeout(context.Background(), apiStopTimeout)
	defer cancel()
	cp.conns.Stop(sctx, cp.hs, cp.log, "control plane API")
	err := <-cp.done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	err = errors.Join(err, cp.st.Close())
	closeLock(cp.lock)
	cp.log.Info("control plane stopped", "took", time.Since(start).Round(time.Millisecond))
	return err
}

// defaultRetainHistory is how long `rialto server` (and `rialto up`)
// keep ended leases and events by default.
const defaultRetainHistory = 7 * 24 * time.Hour

func runServer(e *env, fs *pflag.FlagSet) runFunc {
	listen := fs.String("listen", "127.0.0.1:7070", "address to serve the API on")
	db := fs.String("db", "rialto.db", "SQLite database file, or a PostgreSQL URL postgres://USER@HOST:PORT/DB shared by several replicas (with a password: env RIALTO_DB only, which keeps it out of ps)")
	tlsDir := fs.String("tls-dir", "", "the cluster CA's `directory` (created if absent: ca-cert.pem, ca-key.pem, ca-crl.pem); the API is served over HTTPS with a certificate from it (env RIALTO_TLS_DIR; default: rialto-tls beside --db, or in the working directory for PostgreSQL; replicas share one)")
	var tlsHosts listFlag
	fs.Var(&tlsHosts, "tls-host", "a further host name or address clients reach the API by, put in its certificate (repeatable)")
	advertise := fs.String("advertise-url", "", "this replica's API address as the other replicas reach it (with a shared PostgreSQL database: the elected replica places every lease and the others forward creations and releases to it); default: the --listen address, or the host name when that is a wildcard; \"none\": never forward")
	insecureHTTP := fs.Bool("insecure-http", false, "serve the API over plain HTTP, without TLS: API tokens and lease credentials then cross the network in clear (a trusted network or a test only)")
	bootS := secretFile(fs, e, "bootstrap-token", "RIALTO_BOOTSTRAP_TOKEN", "the token agents join with")
	adminS := secretFile(fs, e, "admin-token", "RIALTO_ADMIN_TOKEN", "the API token of the admin tenant")
	specsS := secretFile(fs, e, "token", "RIALTO_TOKENS", "tenant API tokens, TOKEN:TENANT[:admin] one per line (the environment variable: comma-separated)")
	var quotaSpecs listFlag
	fs.Var(&quotaSpecs, "quota", "tenant quota [TENANT:]leases=N,bytes=SIZE,slots=N,bandwidth=RATE; no TENANT: every tenant's default (repeatable)")
	var tm timings
	tm.register(fs)
	level := fs.String("log-level", "info", "debug, info, warn or error")
	retain := fs.Duration("retain-history", defaultRetainHistory, "how long ended leases (released, expired, lost, failed) and events are kept before the sweep prunes them (docs/operations.md, \"History retention\"); 0: for ever")
	wipeWait := fs.Duration("wipe-wait", 15*time.Second, "how long a lease request that finds no room waits for lenders to wipe the released block ranges that would fit it (docs/placement.md, \"Ranges being wiped\"); 0: the default")
	cfgFile := configFlag(fs, e)
	return func(ctx context.Context, _ []string) error {
		if err := cfgFile.apply(); err != nil {
			return err
		}
		if *wipeWait < 0 {
			return usagef("--wipe-wait must not be negative")
		}
		if flagSet(fs, "db") && dbHasPassword(*db) {
			// The database holds every lease's credential and every
			// node's agent key: its password is a secret like a token.
			return usagef("--db puts the database password on the command line (where every user of the machine sees it: ps, /proc/PID/cmdline) or in the configuration file: use the environment variable RIALTO_DB")
		}
		if v := e.getenv("RIALTO_DB"); v != "" && !flagSet(fs, "db") {
			*db = v
		}
		if v := e.getenv("RIALTO_TLS_DIR"); v != "" && *tlsDir == "" {
			*tlsDir = v
		}
		if *retain < 0 {
			return usagef("--retain-history must not be negative (0 keeps the history for ever)")
		}
		if *insecureHTTP && (*tlsDir != "" || len(tlsHosts) > 0) {
			return usagef("--insecure-http serves no TLS: it does not go with --tls-dir, RIALTO_TLS_DIR or --tls-host")
		}
		if *tlsDir == "" && isPostgresURL(*db) {
			*tlsDir = "rialto-tls"
		} else if *tlsDir == "" {
			*tlsDir = filepath.Join(filepath.Dir(*db), "rialto-tls")
		}
		boot, err := bootS.get()
		if err != nil {
			return err
		}
		admin, err := adminS.get()
		if err != nil {
			return err
		}
		specs, err := specsS.get()
		if err != nil {
			return err
		}
		tokens, err := parseTokens(tokensFrom(specsS), specs)
		if err != nil {
			return usageError{err}
		}
		if admin != "" {
			tokens = append(tokens, controlplane.Token{Token: admin, Tenant: "admin", Admin: true})
		}
		quotas, err := parseQuotas(quotaSpecs)
		if err != nil {
			return usageError{err}
		}
		if boot == "" {
			fmt.Fprintln(e.stderr, "rialto server: no bootstrap token (--bootstrap-token-file, RIALTO_BOOTSTRAP_TOKEN): agents cannot join")
		}
		if len(tokens) == 0 {
			fmt.Fprintln(e.stderr, "rialto server: no API tokens (--admin-token-file, --token-file, RIALTO_ADMIN_TOKEN, RIALTO_TOKENS): nobody can lease")
		}
		log, err := newLogger(e, *level)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		var (
			ca     *pki.CA
			tlsCfg *tls.Config
		)
		if !*insecureHTTP {
			if ca, tlsCfg, err = apiTLS(*tlsDir, *listen, ln, tlsHosts); err != nil {
				ln.Close()
				return err
			}
		}
		adv := *advertise
		switch {
		case adv == "none" || !isPostgresURL(*db):
			adv = ""
		case adv == "":
			adv = advertiseURL(ln.Addr(), tlsCfg != nil)
		}
		cp, err := startControlPlane(ctx, ln, *db, controlplane.Config{
			Logger: log, BootstrapToken: boot, Tokens: tokens, AdvertiseURL: adv,
			HeartbeatInterval: tm.heartbeat, SuspectAfter: tm.suspect, DownAfter: tm.down, MaxHeartbeatsPerSecond: tm.maxBeats,
			PrepareTimeout: tm.prepare, DefaultTTL: tm.ttl, Quotas: quotas, CA: ca, Version: versionString(),
			RetainHistory: *retain, WipeWait: *wipeWait,
		}, tlsCfg)
		if err != nil {
			ln.Close()
			return err
		}
		cp.startSweeping(ctx)
		defer cfgFile.reloadOnHUP(ctx, log, cp.srv)() // SIGHUP: tokens and quotas anew
		log.Info("control plane serving", "url", cp.URL, "db", dbName(*db))
		fmt.Fprintf(e.stdout, "rialto server: serving %s\n", cp.URL)
		if ca != nil {
			caFile, _ := filepath.Abs(ca.CertFile())
			fmt.Fprintf(e.stdout, "rialto server: CA certificate %s (give it to clients: RIALTO_CACERT, --cacert)\n", caFile)
		} else {
			fmt.Fprintln(e.stderr, "rialto server: --insecure-http: the API is served without TLS; tokens cross the network in clear")
		}
		select {
		case <-ctx.Done():
		case err := <-cp.done:
			cp.done <- err
		}
		log.Info("control plane stopping")
		return cp.stop()
	}
}

func flagSet(fs *pflag.FlagSet, name string) bool { return fs.Changed(name) }

// parseQuotas reads --quota specs: the last default and the last quota of
// each tenant win.
func parseQuotas(specs []string) (controlplane.Quotas, error) {
	var q controlplane.Quotas
	for _, spec := range specs {
		tenant, qt, err := controlplane.ParseQuota(spec)
		if err != nil {
			return q, err
		}
		if tenant == "" {
			q.Default = qt
			continue
		}
		if q.Tenants == nil {
			q.Tenants = map[string]controlplane.Quota{}
		}
		q.Tenants[tenant] = qt
	}
	return q, nil
}
