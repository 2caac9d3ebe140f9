package plugin

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report/render"
)

const reportExample = `  # List the migrations recorded in the current namespace
  kubectl migrate report

  # All namespaces
  kubectl migrate report -A

  # One migration's per-phase breakdown (an ID prefix of 3+ characters will do)
  kubectl migrate report x7k2p

  # As data, e.g. to compare strategies across runs
  kubectl migrate report -o json`

// ReportOptions are the options of kubectl migrate report.
type ReportOptions struct {
	*RootOptions
	AllNamespaces bool
	Output        string

	namespace string
	id        string
}

// NewCmdReport returns kubectl migrate report.
func NewCmdReport(root *RootOptions) *cobra.Command {
	o := &ReportOptions{RootOptions: root}
	cmd := &cobra.Command{
		Use:   "report [ID]",
		Short: "Show recorded migrations and their per-phase timings",
		Long: `Without an ID, list the recorded migrations: strategy, pod, source → target
node, outcome, downtime and total time. With an ID, show that migration's
sub-process breakdown: each phase's duration, its share of the whole and a
proportional bar, one stacked bar of the whole migration coloured by phase,
and downtime against total migration time.

Records are ConfigMaps labelled migrate.ms2m.io/record in the migrated pod's
namespace, so any machine with access to the cluster sees them.`,
		Example: reportExample,
		Args:    cobra.MaximumNArgs(1),
		RunE:    runE(o),
	}
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "list migrations in all namespaces")
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "output format: json or yaml (default: a table or the breakdown)")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Complete resolves the namespace and client.
func (o *ReportOptions) Complete(args []string) error {
	if len(args) == 1 {
		o.id = args[0]
	}
	var err error
	if o.namespace, _, err = o.ConfigFlags.ToRawKubeConfigLoader().Namespace(); err != nil {
		return err
	}
	if o.AllNamespaces {
		o.namespace = ""
	}
	return nil
}

// Validate checks the flags.
func (o *ReportOptions) Validate() error { return validateOutput(o.Output) }

// Run prints the list or one record.
func (o *ReportOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	store := report.Store{Client: client}
	cw := o.colourWriter(o.Out)
	if o.id == "" {
		records, err := store.List(ctx, o.namespace)
		if err != nil {
			return err
		}
		for _, r := range records {
			if r.Outcome == report.Running && !migrate.StillRunning(ctx, client, r.Namespace, r.Pod, r.ID) {
				r.Outcome = report.Interrupted
			}
		}
		if o.Output != "" {
			return printData(o.Out, o.Output, records)
		}
		return render.List(cw, records, o.renderOptions(cw))
	}
	r, err := store.Get(ctx, o.namespace, o.id)
	if err != nil {
		return err
	}
	if o.Output != "" {
		return printData(o.Out, o.Output, r)
	}
	return render.Record(cw, r, o.renderOptions(cw))
}
