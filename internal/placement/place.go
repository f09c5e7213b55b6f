package placement

import "fmt"

// Place decides where the lease r asks for goes in s. It is pure and
// deterministic. An impossible request gets an *InfeasibleError (matching
// ErrInfeasible) naming the constraint and each candidate's rejection; a
// malformed one gets an error matching ErrInvalid.
func Place(s *Snapshot, r Request) (Plan, error) {
	return NewIndex(s).Place(r)
}

// Place is Place against the index's snapshot (plus leases added since).
// It runs these stages in order, each in a file of its own:
//
//  1. validate, admit and scopeOf (request.go): a well-formed request, a
//     known and ready borrower, a tenant under its lease quota, and the
//     modes the request allows with the parts they take;
//  2. candidateList (candidates.go, filter.go, order.go): the usable
//     devices nearest the borrower;
//  3. options (options.go): the dedicated, shared and composed options
//     worth predicting;
//  4. evalAll (evaluate.go, utilisation.go): each option's predicted
//     bandwidth, completion and impact on running leases, or its rejection;
//  5. rank (score.go): the best option and up to three runners-up;
//  6. plan (explain.go): the chosen option as a Plan, with the
//     explanation of the choice.
func (x *Index) Place(r Request) (Plan, error) {
	q, err := x.validate(r)
	if err != nil {
		return Plan{}, err
	}
	bv, err := x.admit(&q.Request)
	if err != nil {
		return Plan{}, err
	}
	sc := scopeOf(&q)
	cands, examined, err := x.candidateList(&q, bv, &sc)
	if err != nil {
		return Plan{}, err
	}
	opts := x.options(&q, &sc, cands)
	if len(opts) == 0 {
		return Plan{}, x.noOption(&q, &sc, cands)
	}
	results, rejected := x.evalAll(&q, bv, opts, cands)
	defer x.release(results)
	if len(results) == 0 {
		return Plan{}, newInfeasible(fmt.Sprintf("all %d options for %s rejected", len(rejected), q.borrowerName()), rejected, "")
	}
	var topBuf [4]*result
	top := x.rank(topBuf[:0], results, q.strategy)
	return x.plan(&q, &sc, top, len(results), rejected, cands, examined), nil
}
