package stripe

import (
	"errors"
	"slices"
)

// lossReport is one failure report that flushes hand out as Linux's errseq
// does: ErrWriteBack (an acknowledged write failed at its lender) or
// ErrLostWrites (a part's connection broke with writes no flush had
// covered). Every observer that takes the same report — the flushes under
// way when it is found, Close, a FLUSH that reports again one whose reply
// was lost (untold) — gets the same value, so that a report taken by
// several of them is listed once where their reports meet (untold,
// Attachment.Close). It is created once, where the failure is found.
type lossReport struct{ err error }

func (r *lossReport) Error() string { return r.err.Error() }
func (r *lossReport) Unwrap() error { return r.err }

// reportsIn appends to rs the loss reports in err's tree that rs lacks
// (it does not look inside a report).
func reportsIn(err error, rs []*lossReport) []*lossReport {
	switch e := err.(type) {
	case nil:
	case *lossReport:
		if !slices.Contains(rs, e) {
			rs = append(rs, e)
		}
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			rs = reportsIn(x, rs)
		}
	case interface{ Unwrap() error }:
		rs = reportsIn(e.Unwrap(), rs)
	}
	return rs
}

// onlyReports reports whether err's tree holds loss reports and nothing
// else besides wrappers (a flush that succeeded and reported a loss).
func onlyReports(err error) bool {
	switch e := err.(type) {
	case *lossReport:
		return true
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		for _, x := range errs {
			if !onlyReports(x) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		return onlyReports(e.Unwrap())
	}
	return false
}

// missing returns the reports of rs that known lacks.
func missing(rs, known []*lossReport) []*lossReport {
	var out []*lossReport
	for _, r := range rs {
		if !slices.Contains(known, r) && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// joinReports returns err joined with the loss reports in extra's tree
// that err's lacks (only those: the rest of extra is dropped).
func joinReports(err, extra error) error {
	add := missing(reportsIn(extra, nil), reportsIn(err, nil))
	if len(add) == 0 {
		return err
	}
	errs := []error{err}
	for _, r := range add {
		errs = append(errs, r)
	}
	return errors.Join(errs...)
}

// asErrors returns rs as errors (for errors.Join).
func asErrors(rs []*lossReport) []error {
	errs := make([]error, len(rs))
	for i, r := range rs {
		errs[i] = r
	}
	return errs
}
