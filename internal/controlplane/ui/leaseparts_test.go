package ui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestLeasePageMarksLostParts: a bond that lost a lender goes on without
// it; the lease page listed the lost part like the served ones.
func TestLeasePageMarksLostParts(t *testing.T) {
	u, err := New(Config{API: http.NotFoundHandler()})
	if err != nil {
		t.Fatal(err)
	}
	l := api.Lease{ID: "lease-b", State: api.LeaseActive, Kind: api.KindNIC, Mode: api.ModeShared, Count: 1,
		Parts: []api.Part{{NodeID: "n1", DeviceID: "d1", Length: 1e6, State: api.PartLost}, {NodeID: "n2", DeviceID: "d2", Length: 1e6}}}
	w := httptest.NewRecorder()
	u.render(w, http.StatusOK, "lease", page{Title: "Lease", Session: &session{}, Data: leaseData{Now: time.Now(), Lease: l,
		Names: map[string]string{"n1": "node1", "n2": "node2"}, Devs: map[string]string{}, Live: true}})
	body := w.Body.String()
	if w.Code != http.StatusOK {
		t.Fatalf("render: %d %s", w.Code, body)
	}
	rows := strings.Split(body[strings.Index(body, `<table id="parts">`):], "</tr>")
	var lost, served string
	for _, r := range rows {
		switch {
		case strings.Contains(r, "node1"):
			lost = r
		case strings.Contains(r, "node2"):
			served = r
		}
	}
	if !strings.Contains(lost, `class="part-lost"`) || !strings.Contains(lost, `<span class="st bad">lost</span>`) {
		t.Errorf("the lost part's row does not say it is lost: %s", lost)
	}
	if served == "" || strings.Contains(served, "lost") {
		t.Errorf("the served part's row: %q", served)
	}
}
