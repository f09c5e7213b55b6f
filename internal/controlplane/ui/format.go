package ui

import (
	"fmt"
	"html/template"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/placement"
	"github.com/rialto-project/rialto/internal/resource"
)

var funcs = template.FuncMap{
	"size":      resource.FormatSize,
	"amount":    amount,
	"held":      held,
	"rate":      resource.FormatRate,
	"kindRate":  kindRate,
	"planOf":    func(k api.Kind, p *api.Plan) planView { return planView{p, k} },
	"pct":       pct,
	"seconds":   seconds,
	"ago":       ago,
	"clock":     func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"redacted":  redactURI,
	"lower":     strings.ToLower,
	"hasPrefix": strings.HasPrefix,
	"list":      func(xs ...string) []string { return xs },
	"float":     func(n int64) float64 { return float64(n) },
	"rtt":       rtt,
	"svg":       func(s string) template.HTML { return template.HTML(s) }, // only for SVG this package built and escaped
	"stateClass": func(s string) string {
		switch s {
		case "ready", "active", "up", "available", "feasible":
			return "ok"
		case "suspect", "reserved", "releasing", "requested":
			return "warn"
		case "down", "failed", "lost", "infeasible", "unavailable":
			return "bad"
		}
		return "idle"
	},
}

// amount formats a device quantity as the CLI does: bytes; slots (and
// shares of one) for accelerators, whose quantities are slot units
// (api.SlotUnits a slot); a link rate for a nic, whose quantities are
// bytes/s.
func amount(kind api.Kind, n int64) string {
	switch kind {
	case api.KindAccel:
		return placement.FormatSlots(n, api.SlotUnits)
	case api.KindNIC:
		return resource.FormatLinkRate(float64(n))
	}
	return resource.FormatSize(n)
}

// kindRate formats a rate in bytes/s of a lease of kind as the CLI
// does: a nic's as a link rate (as its size), any other's in bytes/s.
func kindRate(kind api.Kind, bytesPerSec float64) string {
	if kind == api.KindNIC {
		return resource.FormatLinkRate(bytesPerSec)
	}
	return resource.FormatRate(bytesPerSec)
}

// planView is a plan with the kind of its request, in which its predicted
// bandwidth prints (the "plan" template's data).
type planView struct {
	*api.Plan
	Kind api.Kind
}

// held formats what a lease holds (the API's held): bytes, slots (and
// shares of one) or, for a nic lease, a rate; with the size asked for
// beside it where that differs (a dedicated device larger than the size,
// a composed lease's parts rounded up to its stripe unit) and "a whole
// device" where none was asked for.
func held(l api.Lease) string {
	n := l.Held
	if n == 0 {
		n = l.Size
	}
	text := amount(l.Kind, n)
	switch {
	case n == l.Size || l.Kind == api.KindAccel || l.Kind == api.KindNIC:
	case l.Size == 0:
		text += " (a whole device)"
	default:
		text += " (asked for " + amount(l.Kind, l.Size) + ")"
	}
	return text
}

// pct is part of whole in percent, "0%" for an empty whole.
func pct(part, whole int64) string {
	if whole <= 0 {
		return "0%"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(part)/float64(whole))
}

// seconds formats a duration given in seconds.
func seconds(s float64) string {
	if s <= 0 || math.IsInf(s, 0) || math.IsNaN(s) {
		return "—"
	}
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// ago is how long before now t was, coarsely.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "in " + (-d).Round(time.Second).String()
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	}
	return d.Round(time.Minute).String() + " ago"
}

// redactURI shows where a data-plane URI points without its secret: the
// scheme and the address, never the path (the export name, bound to the
// lease credential) nor the query.
func redactURI(s string) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "(hidden)"
	}
	return u.Scheme + "://" + u.Host + "/…"
}

// rtt formats a round trip given in microseconds.
func rtt(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%.2f s", us/1e6)
	case us >= 1000:
		return fmt.Sprintf("%.1f ms", us/1000)
	}
	return fmt.Sprintf("%.0f µs", us)
}
