package plugin

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Exit codes, distinct so that a script can tell what state a failure left
// (the README and `kubectl migrate --help` list them).
const (
	ExitFailed      = 1   // anything else: the cluster or a system could not be reached, …
	ExitUsage       = 2   // bad flags or arguments: nothing was done
	ExitRefused     = 3   // refused before any change (preflight or setup)
	ExitRolledBack  = 4   // failed and rolled back: the source serves
	ExitRecover     = 5   // stopped with its journal kept: kubectl migrate recover ID
	ExitCheckFailed = 6   // kubectl migrate check found a ✗
	ExitInterrupted = 130 // stopped by an interrupt (128 + SIGINT, as shells say)
)

// ExitCodes are every code a command exits with (README's table lists
// them; a test holds the two together).
var ExitCodes = []int{0, ExitFailed, ExitUsage, ExitRefused, ExitRolledBack, ExitRecover, ExitCheckFailed, ExitInterrupted}

// exitCodesHelp is the list of exit codes for --help.
const exitCodesHelp = `Exit codes: 0 done; 1 other failure; 2 bad flags or arguments (nothing done);
3 refused before any change; 4 failed and rolled back (the source serves);
5 stopped with its journal kept (run kubectl migrate recover ID); 6 check ✗;
130 interrupted (a migration interrupted says 4 or 5 instead).`

// ExitError carries the exit code of the state a failure left.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode is the exit status for err (0 for nil).
func ExitCode(err error) int {
	var e *ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e.Code
	}
	return ExitFailed
}

// ExitCodeAfter is the exit status for err of a command an interrupt
// cancelled if interrupted: 130 where the error says no more than that it
// stopped (a migration's rollback or kept journal keeps its own code).
func ExitCodeAfter(err error, interrupted bool) int {
	code := ExitCode(err)
	if interrupted && (code == ExitFailed || code == ExitCheckFailed) {
		return ExitInterrupted
	}
	return code
}

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &ExitError{Code: code, Err: err}
}

// usageError is a bad flag or argument of cmd, with kubectl's pointer to
// its help.
func usageError(cmd *cobra.Command, err error) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())}
}

// outcomeCode is the exit code of a migration that failed with record rec:
// refused in preflight, rolled back, or left to recover (a drain still
// exits with ExitFailed).
func outcomeCode(rec *report.Record) int {
	switch {
	case rec == nil:
		return ExitFailed
	case rec.Outcome == report.RolledBack && rec.ChangedNothing():
		return ExitRefused
	case rec.Outcome == report.RolledBack:
		return ExitRolledBack
	case rec.Outcome == report.Failed, rec.Outcome == report.Committed, rec.Outcome == report.Running:
		return ExitRecover
	}
	return ExitFailed
}
