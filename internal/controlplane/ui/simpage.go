package ui

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/sim"
)

// The simulator's results as plots: the experiments of internal/sim, run
// in the control plane on demand at their default (test) size, with every
// figure's fit-or-prediction tag and the paper's value beside it. The
// simulator is pure and deterministic (seed 0), so a result is computed
// once per process and kept.

// simTimeout bounds one experiment run for the page.
const simTimeout = 60 * time.Second

// simScale is the scale experiment's size on the page: the full
// 10,000-node run (`rialto sim run scale`) takes minutes of CPU, which a
// page view must not cost the control plane.
var simScale = sim.ScaleSpec{Nodes: 1000, RackSize: 40, DevicesPerNode: 2, Leases: 20000, Concurrency: 1000,
	Bytes: 2e9, RemoteShare: 0.8, ComposeShare: 0.25, ComposeFactor: 1.5}

// simResults keeps each experiment's result; mu serializes runs, so a
// burst of page views runs an experiment once.
type simResults struct {
	mu   sync.Mutex
	done map[string]sim.Result
}

func (c *simResults) get(ctx context.Context, name string) (sim.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.done[name]; ok {
		return r, nil
	}
	ctx, cancel := context.WithTimeout(ctx, simTimeout)
	defer cancel()
	r, err := sim.Run(ctx, name, sim.Options{ScaleSpec: simScale})
	if err != nil {
		return sim.Result{}, err
	}
	if c.done == nil {
		c.done = map[string]sim.Result{}
	}
	c.done[name] = r
	return r, nil
}

type simListData struct {
	Experiments []sim.ExperimentInfo
}

type simMetricRow struct {
	sim.Metric
	Tag     string // "fit" or "prediction"
	Verdict string
}

type simData struct {
	Result sim.Result
	Paper  string // the paper's title and authors, "" for Rialto's own findings
	Plot   string // SVG
	Rows   []simMetricRow
}

func (u *UI) simList(w http.ResponseWriter, r *http.Request, s *session) {
	u.render(w, http.StatusOK, "sim", page{Title: "Simulator", Nav: "sim", Session: s,
		Data: simListData{Experiments: sim.Experiments()}})
}

func (u *UI) simExperiment(w http.ResponseWriter, r *http.Request, s *session) {
	name := r.PathValue("name")
	res, err := u.sim.get(r.Context(), name)
	switch {
	case errors.Is(err, sim.ErrUnknownExperiment):
		u.renderError(w, r, s, http.StatusNotFound, "no simulator experiment "+name+"; the Simulator page lists them")
		return
	case err != nil:
		u.renderError(w, r, s, http.StatusUnprocessableEntity, "the experiment could not run here: "+err.Error()+
			" (trace-driven experiments need `rialto sim run NAME --traces DIR`)")
		return
	}
	d := simData{Result: res, Paper: sim.Papers[res.Paper].Cite}
	if len(res.Plot.Series) > 0 {
		d.Plot = string(res.Plot.SVG())
	}
	for _, m := range res.Metrics {
		d.Rows = append(d.Rows, simMetricRow{Metric: m, Tag: string(m.Kind), Verdict: m.Verdict()})
	}
	u.render(w, http.StatusOK, "simresult", page{Title: "Simulator: " + res.Name, Nav: "sim", Session: s, Data: d})
}
