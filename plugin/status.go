package plugin

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report/render"
)

var (
	doneMark = render.DoneMark
	failMark = render.FailMark
	undoMark = render.UndoMark
	dimStyle = render.Dim
)

var spinnerFrames = []rune("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")

// status shows a spinner, then ✓ or ✗ per phase, on stderr. Without a
// terminal it prints one line per finished phase.
type status struct {
	w       io.Writer
	tty     bool
	verbose int

	mu      sync.Mutex
	phase   string
	started time.Time
	stop    chan struct{}
	done    sync.WaitGroup
}

func newStatus(o *RootOptions) *status {
	return newStatusOn(o, o.ErrOut, o.Quiet)
}

// newStatusOn shows progress on out, or nothing if quiet.
func newStatusOn(o *RootOptions, out io.Writer, quiet bool) *status {
	s := &status{w: o.colourWriter(out), verbose: o.Verbosity}
	if quiet {
		s.w = io.Discard
	}
	if f, ok := out.(*os.File); ok && !quiet {
		s.tty = term.IsTerminal(int(f.Fd()))
	}
	return s
}

// hooks are the engine's hooks that show s. With crashAt (PHASE or
// PHASE/STAGE, the hidden --inject-crash) the process kills itself as that
// phase starts, after the journal names it: the tests' way to prove
// recovery from a CLI that died at that step.
func (s *status) hooks(crashAt string) migrate.Hooks {
	started := s.phaseStarted
	if crashAt != "" {
		started = func(p report.PhaseTiming) {
			if crashAt == string(p.Name) || crashAt == string(p.Name)+"/"+p.Stage {
				s.printLine(failMark + " " + p.Label() + ": killed by --inject-crash")
				if self, err := os.FindProcess(os.Getpid()); err == nil {
					_ = self.Kill() // SIGKILL: no deferred function runs
				}
				select {} // the signal is on its way
			}
			s.phaseStarted(p)
		}
	}
	return migrate.Hooks{
		PhaseStarted:  started,
		PhaseFinished: s.phaseFinished,
		Progress: func(_ report.PhaseName, msg string) {
			if s.verbose > 0 {
				s.printLine("  " + dimStyle.Render(msg))
			}
		},
		RollbackStarted: func(cause error) {
			s.printLine(undoMark + " rolling back: the source keeps serving")
		},
		LockLost: func(err error) {
			s.printLine(failMark + " " + err.Error() + ": stopping without touching the cluster again")
		},
	}
}

func (s *status) phaseStarted(p report.PhaseTiming) { s.begin(p.Label()) }

// begin spins beside what runs, on a terminal, until the next line.
func (s *status) begin(what string) {
	s.mu.Lock()
	s.phase, s.started = what, time.Now()
	s.mu.Unlock()
	if !s.tty {
		return
	}
	s.stop = make(chan struct{})
	s.done.Add(1)
	go s.spin(s.stop)
}

func (s *status) spin(stop <-chan struct{}) {
	defer s.done.Done()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		s.mu.Lock()
		fmt.Fprintf(s.w, "\r\033[K%c %s %s", spinnerFrames[i%len(spinnerFrames)], s.phase, dimStyle.Render(time.Since(s.started).Round(100*time.Millisecond).String()))
		s.mu.Unlock()
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

func (s *status) phaseFinished(p report.PhaseTiming, took time.Duration, err error) {
	s.phaseLine(p, took.Milliseconds(), err != nil)
}

// phaseLine ends the spinner with a finished phase's line: ✓ or ✗, its
// name and how long it took.
func (s *status) phaseLine(p report.PhaseTiming, millis int64, failed bool) {
	s.end()
	mark := doneMark
	if failed {
		mark = failMark
	}
	s.printLine(fmt.Sprintf("%s %s %s", mark, p.Label(), dimStyle.Render(render.FormatMillis(millis))))
}

// end stops the spinner begin started.
func (s *status) end() {
	if s.stop != nil {
		close(s.stop)
		s.done.Wait()
		s.stop = nil
	}
}

// printLine prints a whole line, clearing a spinner first.
func (s *status) printLine(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty {
		fmt.Fprint(s.w, "\r\033[K")
	}
	fmt.Fprintln(s.w, line)
}
