package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report/render"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

const reportExample = `  # List the migrations recorded in the current namespace
  kubectl migrate report

  # All namespaces
  kubectl migrate report -A

  # One migration's per-phase breakdown (an ID prefix of 3+ characters will do)
  kubectl migrate report x7k2p

  # Follow a running migration (another terminal's, a CI job's): each phase as it ends
  kubectl migrate report x7k2p -w

  # Compare strategies: the runs labelled rate=10, one bar per strategy (medians)
  kubectl migrate report --compare -l rate=10 --group-by strategy

  # Two runs side by side
  kubectl migrate report --compare x7k2p q9w8e

  # Every run as CSV (phases, steps, downtime, totals, broker figures), for a spreadsheet or a plot
  kubectl migrate report -o csv > runs.csv

  # As data
  kubectl migrate report -o json`

// ReportOptions are the options of kubectl migrate report.
type ReportOptions struct {
	*RootOptions
	AllNamespaces bool
	NoHeaders     bool
	Output        string
	Compare       bool
	Selector      string
	GroupBy       string
	Watch         bool

	namespace string
	ids       []string
	selector  labels.Selector
}

// NewCmdReport returns kubectl migrate report.
func NewCmdReport(root *RootOptions) *cobra.Command {
	o := &ReportOptions{RootOptions: root}
	cmd := &cobra.Command{
		Use:   "report [ID]",
		Short: "Show recorded migrations and their per-phase timings",
		Long: `Without an ID, list the recorded migrations as kubectl get lists objects
(plain columns, --no-headers, -A); those that did not end are named on
stderr with the command that ends each. With an ID, show its breakdown: each
phase's duration and share, and downtime against total time.

With --compare, draw the selected migrations (the IDs given, or -l on their
--label labels, strategy, mode and outcome) side by side, or with --group-by
KEY one bar of medians per value. -o csv writes every phase and step in
milliseconds, a row per run. Records are ConfigMaps labelled
migrate.ms2m.io/record in the pod's namespace.

More: ` + version.DocsURL("performance.md"),
		Example: reportExample,
		Args:    cobra.ArbitraryArgs,
		RunE:    runE(o),
	}
	f := cmd.Flags()
	f.BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "list migrations in all namespaces")
	f.BoolVar(&o.NoHeaders, "no-headers", false, "leave the list's header row out")
	f.StringVarP(&o.Output, "output", "o", "", "output format: csv, name, "+outputFormats+" (default: a table or the breakdown)")
	f.BoolVar(&o.Compare, "compare", false, "draw the selected migrations side by side")
	f.StringVarP(&o.Selector, "selector", "l", "", "select migrations by label (e.g. rate=10,strategy=ms2m)")
	f.BoolVarP(&o.Watch, "watch", "w", false, "with one ID: follow the migration, a line per phase as it ends, then its breakdown")
	f.StringVar(&o.GroupBy, "group-by", "", "with --compare, one bar per value of this label (or strategy, mode, outcome): the group's medians")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(append([]string{"csv", outputName}, outputCompletions...), cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Complete resolves the namespace and client.
func (o *ReportOptions) Complete(args []string) error {
	o.ids = args
	var err error
	if o.selector, err = labels.Parse(o.Selector); err != nil {
		return fmt.Errorf("-l %q is not a label selector: %w", o.Selector, err)
	}
	if o.namespace, _, err = o.ConfigFlags.ToRawKubeConfigLoader().Namespace(); err != nil {
		return err
	}
	if o.AllNamespaces {
		o.namespace = ""
	}
	return nil
}

// Validate checks the flags.
func (o *ReportOptions) Validate() error {
	switch {
	case len(o.ids) > 1 && !o.Compare:
		return errors.New("give one migration ID, or --compare to draw several side by side")
	case o.GroupBy != "" && !o.Compare:
		return errors.New("--group-by applies to --compare")
	case o.Watch && (len(o.ids) != 1 || o.Compare || o.Output != ""):
		return errors.New("--watch follows one migration: give its ID, without --compare or -o")
	case o.Output != "" && o.Output != "csv" && validateNamedOutput(o.Output) != nil:
		return fmt.Errorf("--output must be csv, name, %s, not %q", outputFormats, o.Output)
	}
	return nil
}

// Run prints the list, one record, or the comparison.
func (o *ReportOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	store := report.Store{Client: client}
	cw := o.colourWriter(o.Out)
	if len(o.ids) == 1 && !o.Compare {
		r, err := store.Get(ctx, o.namespace, o.ids[0])
		if err != nil {
			return err
		}
		if o.Watch {
			if r, err = o.follow(ctx, store, client, r); err != nil {
				return err
			}
		}
		switch o.Output {
		case "":
			return render.Record(cw, r, o.renderOptions(cw))
		case "csv":
			return report.WriteCSV(o.Out, []*report.Record{r})
		}
		return o.printRecord(r, o.Output)
	}
	records, err := o.selected(ctx, store, client)
	if err != nil {
		return err
	}
	switch {
	case o.Output == "csv":
		return report.WriteCSV(o.Out, records)
	case o.Output == outputName:
		for _, r := range records {
			if _, err := fmt.Fprintln(o.Out, recordName(r)); err != nil {
				return err
			}
		}
		return nil
	case o.Output != "":
		if records == nil {
			records = []*report.Record{} // [] for none, not null
		}
		return printData(o.Out, o.Output, records)
	case o.Compare:
		return render.Compare(cw, render.GroupBy(records, o.GroupBy), o.renderOptions(cw))
	}
	if len(records) == 0 {
		where := "in namespace " + o.namespace
		if o.namespace == "" {
			where = "in any namespace"
		}
		_, err := fmt.Fprintf(o.ErrOut, "No migrations recorded %s.\n", where)
		return err
	}
	opts := o.renderOptions(cw)
	opts.NoHeaders, opts.AllNamespaces = o.NoHeaders, o.AllNamespaces
	if err := render.List(o.Out, records, opts); err != nil {
		return err
	}
	return render.RecoverHints(o.ErrOut, records)
}

// selected are the records named by ID, or else those the selector matches,
// with migrations that no process runs any more shown as interrupted.
func (o *ReportOptions) selected(ctx context.Context, store report.Store, client kubernetes.Interface) ([]*report.Record, error) {
	var records []*report.Record
	if len(o.ids) > 0 {
		for _, id := range o.ids {
			r, err := store.Get(ctx, o.namespace, id)
			if err != nil {
				return nil, err
			}
			records = append(records, r)
		}
	} else {
		all, err := store.List(ctx, o.namespace)
		if err != nil {
			return nil, err
		}
		for _, r := range all {
			if o.selector.Matches(labels.Set(r.Facets())) {
				records = append(records, r)
			}
		}
	}
	for _, r := range records {
		running := lease.StillRunning
		if r.Drain != nil {
			running = lease.DrainStillRunning
		}
		if r.Outcome == report.Running && !running(ctx, client, r.Namespace, r.Pod, r.ID) {
			r.Outcome = report.Interrupted
		}
	}
	return records, nil
}

// follow prints each phase of r's migration as it ends, until the
// migration does, and returns its last record. A migration whose process
// died ends the watch with the command that finishes or undoes it.
func (o *ReportOptions) follow(ctx context.Context, store report.Store, client kubernetes.Interface, r *report.Record) (*report.Record, error) {
	st := newStatus(o.RootOptions)
	printed := 0
	last := r
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A record that stops changing may be one no process runs any more.
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		if r.Drain == nil && !lease.StillRunning(ctx, client, r.Namespace, r.Pod, r.ID) {
			cancel(fmt.Errorf("migration %s is not running any more (its process ended without finishing it): %s", r.ID, report.RecoverCommand(r.Namespace, r.ID)))
		}
	}, followCheck)
	err := store.Watch(ctx, r, func(rec *report.Record) bool {
		last = rec
		for ; printed < len(rec.Phases) && !rec.Phases[printed].Running; printed++ {
			p := rec.Phases[printed]
			st.phaseLine(p, p.DurationMillis, p.Error != "")
		}
		st.end()
		if rec.Outcome.Final() {
			return true
		}
		if printed < len(rec.Phases) {
			st.begin(rec.Phases[printed].Label())
		}
		return false
	})
	st.end()
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return last, cause
	}
	return last, err
}

// followCheck is how often report -w asks whether the migration's process
// still holds its lock.
const followCheck = 5 * time.Second
