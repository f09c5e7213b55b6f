package main

import (
	"os"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"
)

// progress is a progress bar on stderr for long work (characterize,
// attach's first connection, sim runs, lease moves), drawn only when stderr is a
// terminal: logs and pipes get the verb's usual lines instead. A nil
// *progress is off; its methods do nothing.
type progress struct{ bar *progressbar.ProgressBar }

// stderrIsTerminal reports whether e's stderr is a terminal.
func stderrIsTerminal(e *env) bool {
	f, ok := e.stderr.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// newProgress starts a bar of total steps (-1: a spinner) described by
// desc, or returns nil when stderr is not a terminal.
func newProgress(e *env, total int, desc string) *progress {
	if !stderrIsTerminal(e) {
		return nil
	}
	return &progress{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(e.stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetRenderBlankState(true))}
}

// step advances the bar by one and describes what runs next.
func (p *progress) step(desc string) {
	if p == nil {
		return
	}
	p.bar.Add(1)
	p.bar.Describe(desc)
}

// set shows n of total (bytes) and describes the work.
func (p *progress) set(n, total int64, desc string) {
	if p == nil {
		return
	}
	if total > 0 && total != p.bar.GetMax64() {
		p.bar.ChangeMax64(total)
	}
	p.bar.Describe(desc)
	p.bar.Set64(min(n, max(total, 0)))
}

// done clears the bar.
func (p *progress) done() {
	if p == nil {
		return
	}
	p.bar.Finish()
	p.bar.Exit()
}
