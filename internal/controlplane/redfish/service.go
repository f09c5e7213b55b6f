package redfish

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
)

// Config configures a Service. API is required.
type Config struct {
	// API serves the control plane's /v1 routes; the facade calls it in
	// process with each caller's token.
	API    http.Handler
	Logger *slog.Logger // nil: discard
	// DefaultTTL is the lease TTL of an applied reservation (a composed
	// system made with Compose Apply); 0: an hour. Systems composed with
	// POST /redfish/v1/Systems get the control plane's default TTL unless
	// the request's Oem.Rialto.TTLSeconds says otherwise.
	DefaultTTL time.Duration
	// ReservationDuration is how long a PreviewReserve holds its devices
	// before they are freed unless applied (default 5 minutes).
	ReservationDuration time.Duration
	// SessionTimeout ends a login session unused for this long (default
	// 30 minutes).
	SessionTimeout time.Duration
	// UUID is the service root's UUID (default: one derived from "rialto").
	UUID string
	// Now tells the time (default time.Now).
	Now func() time.Time
}

// Service is the Redfish facade; it is an http.Handler for /redfish and
// everything under it.
type Service struct {
	cfg Config
	log *slog.Logger
	hc  *http.Client

	mu           sync.Mutex
	sessions     map[string]*session     // by hash of the session token
	reservations map[string]*reservation // by reservation (lease) ID
}

type session struct {
	id, hash string
	rialto   string // the Rialto token the session stands for (secret)
	owner    string // hashToken(rialto)
	user     string
	created  time.Time
	seen     time.Time
}

type reservation struct {
	id       string   // the reservation's ID: its first lease's
	leases   []string // the leases holding its devices
	owner    string   // hash of the Rialto token that made it
	client   string
	created  time.Time
	blocks   []string
	manifest json.RawMessage
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.API == nil {
		return nil, errors.New("redfish: Config.API is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DefaultTTL <= 0 {
		cfg.DefaultTTL = time.Hour
	}
	if cfg.ReservationDuration <= 0 {
		cfg.ReservationDuration = 5 * time.Minute
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 30 * time.Minute
	}
	if cfg.UUID == "" {
		h := sha256.Sum256([]byte("rialto redfish service"))
		x := hex.EncodeToString(h[:16])
		cfg.UUID = x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, log: cfg.Logger, hc: &http.Client{Transport: inproc{cfg.API}},
		sessions: map[string]*session{}, reservations: map[string]*reservation{}}, nil
}

// apiBase is the (never dialled) base URL of in-process /v1 calls.
const apiBase = "http://rialto.internal"

// caller is an authenticated request's principal.
type caller struct {
	token   string // Rialto token
	user    string
	session *session
	c       *api.Client
}

func hashToken(t string) string {
	h := sha256.Sum256([]byte(t))
	return hex.EncodeToString(h[:])
}

// client returns a /v1 client acting with token.
func (s *Service) client(token string) *api.Client {
	return api.NewClient(apiBase, token, s.hc)
}

// checkToken asks the control plane whether token is a tenant token or a
// node credential: the cheapest authenticated read.
func (s *Service) checkToken(ctx context.Context, token string) error {
	return s.client(token).Do(ctx, http.MethodGet, "/v1/events?since=9223372036854775807&limit=1", nil, nil)
}

// authenticate resolves a request's credentials: a session's X-Auth-Token,
// Basic auth whose password is a Rialto token (the user name is only
// recorded), or "Bearer <Rialto token>".
func (s *Service) authenticate(r *http.Request) (*caller, error) {
	if t := r.Header.Get("X-Auth-Token"); t != "" {
		s.mu.Lock()
		sess := s.sessions[hashToken(t)]
		now := s.cfg.Now()
		if sess != nil && now.Sub(sess.seen) > s.cfg.SessionTimeout {
			delete(s.sessions, sess.hash)
			sess = nil
		}
		if sess != nil {
			sess.seen = now
		}
		s.mu.Unlock()
		if sess == nil {
			return nil, errNoSession("the X-Auth-Token names no session (expired or deleted); log in again at /redfish/v1/SessionService/Sessions")
		}
		return &caller{token: sess.rialto, user: sess.user, session: sess, c: s.client(sess.rialto)}, nil
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, errNoSession("authenticate with Basic auth (password: a Rialto API token), a session's X-Auth-Token, or Authorization: Bearer <Rialto token>")
	}
	var c caller
	if user, pass, ok := r.BasicAuth(); ok {
		c.user, c.token = user, pass
	} else if scheme, tok, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
		c.token = strings.TrimSpace(tok)
	}
	if c.token == "" {
		return nil, errNoSession("the Authorization header must be Basic (password: a Rialto API token) or Bearer <Rialto token>")
	}
	if err := s.checkToken(r.Context(), c.token); err != nil {
		return nil, err
	}
	c.c = s.client(c.token)
	return &c, nil
}

// ServeHTTP serves /redfish and /redfish/v1/...
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimRight(r.URL.Path, "/")
	if path == "/redfish" {
		if !methodIs(w, r, "GET", "HEAD") {
			return
		}
		writeJSON(w, r, http.StatusOK, obj{"v1": "/redfish/v1/"}, "GET, HEAD")
		return
	}
	if v := r.Header.Get("OData-Version"); v != "" && v != "4.0" {
		writeError(w, &rfError{status: http.StatusPreconditionFailed, id: "GeneralError", msg: "OData-Version " + v + " is not supported; this service speaks 4.0"})
		return
	}
	rest, ok := strings.CutPrefix(path, "/redfish/v1")
	if !ok || (rest != "" && rest[0] != '/') {
		writeError(w, errNotFound(r.URL.Path))
		return
	}
	segs := strings.Split(strings.TrimPrefix(rest, "/"), "/")
	if rest == "" {
		segs = nil
	}
	// What anyone may read, and logging in.
	switch {
	case len(segs) == 0:
		if methodIs(w, r, "GET", "HEAD") {
			writeJSON(w, r, http.StatusOK, s.serviceRoot(), "GET, HEAD")
		}
		return
	case len(segs) == 1 && segs[0] == "$metadata":
		if methodIs(w, r, "GET", "HEAD") {
			writeMetadata(w, r)
		}
		return
	case len(segs) == 1 && segs[0] == "odata":
		if methodIs(w, r, "GET", "HEAD") {
			writeJSON(w, r, http.StatusOK, odataDocument(), "GET, HEAD")
		}
		return
	case len(segs) == 2 && segs[0] == "SessionService" && segs[1] == "Sessions" && r.Method == http.MethodPost:
		s.login(w, r)
		return
	}
	c, err := s.authenticate(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.route(w, r, c, segs)
}

func methodIs(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	allow := strings.Join(methods, ", ")
	w.Header().Set("Allow", allow)
	writeError(w, &rfError{status: http.StatusMethodNotAllowed, id: "OperationNotAllowed", msg: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow)})
	return false
}

// route dispatches an authenticated request.
func (s *Service) route(w http.ResponseWriter, r *http.Request, c *caller, segs []string) {
	n := len(segs)
	at := func(i int, name string) bool { return n > i && segs[i] == name }
	ctx := r.Context()
	get := func(allow string, f func() (obj, error)) {
		methods := strings.Split(allow, ", ")
		if !methodIs(w, r, methods...) {
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return // the caller handles other methods itself
		}
		o, err := f()
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, r, http.StatusOK, o, allow)
	}
	switch {
	case at(0, "Systems") && n == 1:
		if r.Method == http.MethodPost {
			s.composeSystem(w, r, c)
			return
		}
		get("GET, HEAD, POST", func() (obj, error) { return s.systems(ctx, c) })
	case at(0, "Systems") && n >= 2:
		if n == 2 && r.Method == http.MethodDelete {
			s.decompose(w, r, c, segs[1])
			return
		}
		allow := "GET, HEAD"
		if n == 2 {
			allow = "GET, HEAD, DELETE"
		}
		get(allow, func() (obj, error) { return s.systemTree(ctx, c, segs[1], segs[2:]) })
	case at(0, "Chassis") && n == 1:
		get("GET, HEAD", func() (obj, error) { return s.chassisCollection(ctx, c) })
	case at(0, "Chassis") && n == 2:
		get("GET, HEAD", func() (obj, error) { return s.chassis(ctx, c, segs[1]) })
	case at(0, "CompositionService") && n == 1:
		get("GET, HEAD", func() (obj, error) { return s.compositionService(), nil })
	case at(0, "CompositionService") && at(1, "Actions") && n == 3 && segs[2] == "CompositionService.Compose":
		if methodIs(w, r, "POST") {
			s.composeAction(w, r, c)
		}
	case at(0, "CompositionService") && (at(1, "ResourceBlocks") || at(1, "ActivePool") || at(1, "FreePool")) && n == 2:
		get("GET, HEAD", func() (obj, error) { return s.blockCollection(ctx, c, segs[1]) })
	case at(0, "CompositionService") && at(1, "ResourceBlocks") && n >= 3:
		get("GET, HEAD", func() (obj, error) { return s.blockTree(ctx, c, segs[2], segs[3:]) })
	case at(0, "CompositionService") && at(1, "ResourceZones") && n == 2:
		get("GET, HEAD", func() (obj, error) { return s.zoneCollection(), nil })
	case at(0, "CompositionService") && at(1, "ResourceZones") && n == 3:
		get("GET, HEAD", func() (obj, error) { return s.zone(ctx, c, segs[2]) })
	case at(0, "CompositionService") && at(1, "CompositionReservations") && n == 2:
		get("GET, HEAD", func() (obj, error) { return s.reservationCollection(ctx, c) })
	case at(0, "CompositionService") && at(1, "CompositionReservations") && n == 3:
		if r.Method == http.MethodDelete {
			s.deleteReservation(w, r, c, segs[2])
			return
		}
		get("GET, HEAD, DELETE", func() (obj, error) { return s.reservationResource(ctx, c, segs[2]) })
	case at(0, "EventService") && n == 1:
		get("GET, HEAD", func() (obj, error) { return eventService(), nil })
	case at(0, "EventService") && at(1, "Subscriptions") && n == 2:
		get("GET, HEAD", func() (obj, error) {
			return collection("/redfish/v1/EventService/Subscriptions", "EventDestinationCollection", "Event subscriptions", nil), nil
		})
	case at(0, "EventService") && at(1, "SSE") && n == 2:
		if methodIs(w, r, "GET") {
			s.sse(w, r, c)
		}
	case at(0, "SessionService") && n == 1:
		get("GET, HEAD", func() (obj, error) { return s.sessionService(), nil })
	case at(0, "SessionService") && at(1, "Sessions") && n == 2:
		get("GET, HEAD, POST", func() (obj, error) { return s.sessionCollection(c), nil })
	case at(0, "SessionService") && at(1, "Sessions") && n == 3:
		if r.Method == http.MethodDelete {
			s.logout(w, r, c, segs[2])
			return
		}
		get("GET, HEAD, DELETE", func() (obj, error) { return s.sessionResource(c, segs[2]) })
	default:
		writeError(w, errNotFound(r.URL.Path))
	}
}
