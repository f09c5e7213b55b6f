package redfish

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"sort"

	"github.com/rialto-project/rialto/api"
)

const maxSessions = 10000

// maxSessionsPerToken bounds one token's sessions, so that one tenant
// cannot take every session (maxSessions) from the others.
const maxSessionsPerToken = 64

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// login creates a session (POST /redfish/v1/SessionService/Sessions):
// UserName is recorded, Password is a Rialto API token. The answer's
// X-Auth-Token header is the session's token.
func (s *Service) login(w http.ResponseWriter, r *http.Request) {
	var body struct {
		UserName string `json:"UserName"`
		Password string `json:"Password"`
	}
	if err := decodeBody(r, &body); err != nil {
		writeError(w, err)
		return
	}
	if body.Password == "" {
		writeError(w, errBadRequest("PropertyMissing", "Password (a Rialto API token) is required to log in"))
		return
	}
	if err := s.checkToken(r.Context(), body.Password); err != nil {
		if api.IsCode(err, api.CodeUnauthorized) || api.IsCode(err, api.CodeForbidden) {
			err = errNoSession("login refused: the password is not a Rialto tenant token or node credential")
		}
		writeError(w, err)
		return
	}
	token := "rfs_" + randomHex(24)
	now := s.cfg.Now()
	sess := &session{id: randomHex(8), hash: hashToken(token), rialto: body.Password, owner: hashToken(body.Password), user: body.UserName, created: now, seen: now}
	s.mu.Lock()
	own := 0
	for h, old := range s.sessions {
		if now.Sub(old.seen) > s.cfg.SessionTimeout {
			delete(s.sessions, h)
		} else if old.owner == sess.owner {
			own++
		}
	}
	if own >= maxSessionsPerToken {
		s.mu.Unlock()
		writeError(w, &rfError{status: http.StatusTooManyRequests, id: "SessionLimitExceeded",
			msg: fmt.Sprintf("this token already has %d open sessions; delete some or use Basic auth", maxSessionsPerToken)})
		return
	}
	if len(s.sessions) >= maxSessions {
		s.mu.Unlock()
		writeError(w, &rfError{status: http.StatusServiceUnavailable, id: "SessionLimitExceeded", msg: "too many open sessions; delete some or use Basic auth"})
		return
	}
	s.sessions[sess.hash] = sess
	s.mu.Unlock()
	w.Header().Set("X-Auth-Token", token)
	w.Header().Set("Location", pSessions+"/"+sess.id)
	writeJSON(w, nil, http.StatusCreated, sessionObj(sess), "")
}

func sessionObj(sess *session) obj {
	return obj{
		"@odata.id":   pSessions + "/" + sess.id,
		"@odata.type": typeOf("Session"),
		"Id":          sess.id,
		"Name":        "User session",
		"UserName":    sess.user,
		"Password":    nil,
		"SessionType": "Redfish",
		"CreatedTime": sess.created.UTC().Format("2006-01-02T15:04:05Z07:00"),
	}
}

// ownSessions are the sessions that stand for c's token.
func (s *Service) ownSessions(c *caller) []*session {
	h := hashToken(c.token)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*session
	for _, sess := range s.sessions {
		if sess.owner == h {
			out = append(out, sess)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].created.Before(out[j].created) || (out[i].created.Equal(out[j].created) && out[i].id < out[j].id)
	})
	return out
}

func (s *Service) sessionCollection(c *caller) obj {
	var ms []string
	for _, sess := range s.ownSessions(c) {
		ms = append(ms, pSessions+"/"+sess.id)
	}
	return collection(pSessions, "SessionCollection", "Sessions of this token", ms)
}

func (s *Service) sessionResource(c *caller, id string) (obj, error) {
	for _, sess := range s.ownSessions(c) {
		if sess.id == id {
			return sessionObj(sess), nil
		}
	}
	return nil, errNotFound(pSessions + "/" + id)
}

// logout deletes one of the caller's sessions.
func (s *Service) logout(w http.ResponseWriter, r *http.Request, c *caller, id string) {
	for _, sess := range s.ownSessions(c) {
		if sess.id == id {
			s.mu.Lock()
			delete(s.sessions, sess.hash)
			s.mu.Unlock()
			w.Header().Set("OData-Version", "4.0")
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	writeError(w, errNotFound(pSessions+"/"+id))
}
