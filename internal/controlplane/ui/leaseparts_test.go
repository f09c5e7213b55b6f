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

// TestPagesShowQuantitiesInTheirUnits: a nic lease's size and parts are
// link rates and an accel lease's parts slots, as the CLI prints them, on
// the lease page and in a dry run's plan; the parts' lengths were shown as
// bytes ("79.5MiB" for 666.7Mbit/s, "250B" for a quarter slot).
func TestPagesShowQuantitiesInTheirUnits(t *testing.T) {
	u, err := New(Config{API: http.NotFoundHandler()})
	if err != nil {
		t.Fatal(err)
	}
	bond := []api.Part{{NodeID: "n1", DeviceID: "d1", Length: 83_333_333}, {NodeID: "n2", DeviceID: "d2", Length: 83_333_333},
		{NodeID: "n2", DeviceID: "d3", Length: 83_333_334}}
	for _, c := range []struct {
		l    api.Lease
		want []string
	}{
		// A nic lease's plan predicts a link rate, as its size reads; a
		// lease it slows shows its rates as its kind's (a nic's in bits,
		// a block lease's in bytes).
		{api.Lease{ID: "lease-n", State: api.LeaseActive, Kind: api.KindNIC, Mode: api.ModeComposed, Count: 3, Size: 250e6, Held: 250e6, Parts: bond,
			Plan: &api.Plan{State: "feasible", Mode: api.ModeComposed, Parts: bond, PredictedBandwidth: 250e6, Impacts: []api.Impact{
				{LeaseID: "lease-b", Kind: api.KindBlock, BandwidthBefore: 200e6, BandwidthAfter: 150e6},
				{LeaseID: "lease-m", Kind: api.KindNIC, BandwidthBefore: 62.5e6, BandwidthAfter: 50e6}}}},
			[]string{"<dd>2Gbit/s over 3 devices</dd>", `<td class="num">666.7Mbit/s</td>`, "<dd>2Gbit/s</dd>",
				`<td class="num">200MB/s</td><td class="num">150MB/s</td>`, `<td class="num">500Mbit/s</td><td class="num">400Mbit/s</td>`}},
		{api.Lease{ID: "lease-a", State: api.LeaseActive, Kind: api.KindAccel, Mode: api.ModeShared, Count: 1, Size: 250, Held: 250,
			Parts: []api.Part{{NodeID: "n1", DeviceID: "d1", Offset: 1250, Length: 250}}},
			[]string{"<dd>0.25 slot</dd>", `<td class="num">1.25 slots</td><td class="num">0.25 slot</td>`}},
	} {
		w := httptest.NewRecorder()
		u.render(w, http.StatusOK, "lease", page{Title: "Lease", Session: &session{}, Data: leaseData{Now: time.Now(), Lease: c.l,
			Names: map[string]string{}, Devs: map[string]string{}, Live: true}})
		for _, want := range c.want {
			if !strings.Contains(w.Body.String(), want) {
				t.Errorf("%s page lacks %q:\n%s", c.l.Kind, want, w.Body.String())
			}
		}
	}
	w := httptest.NewRecorder()
	u.formPage(w, http.StatusOK, &session{}, leaseForm{Kind: "nic", Count: "3", Bandwidth: "2Gbit/s"},
		&api.Plan{State: "feasible", Mode: api.ModeComposed, Parts: bond, PredictedBandwidth: 250e6}, map[string]string{}, map[string]string{}, "")
	for _, want := range []string{`<td class="num">666.7Mbit/s</td>`, "<dd>2Gbit/s</dd>"} {
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("the dry run's plan lacks %q:\n%s", want, w.Body.String())
		}
	}
}
