package controlplane

import (
	"net/http"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/redfish"
)

// redfishService builds the Redfish facade over the /v1 routes of api.
func (s *Server) redfishService(api http.Handler) http.Handler {
	rf, err := redfish.New(redfish.Config{API: api, Logger: s.log.With("component", "redfish"), DefaultTTL: s.cfg.DefaultTTL,
		Now: func() time.Time { return s.clock.Now() }})
	if err != nil {
		panic("controlplane: redfish: " + err.Error()) // API is given; a test covers it
	}
	return rf
}
