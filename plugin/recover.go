package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/broker"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

const recoverExample = `  # Finish or undo migration x7k2p, whose kubectl migrate process died
  kubectl migrate recover x7k2p

  # The broker's password is not kept in the journal: if it was given by
  # --broker-url rather than the pod's ms2m.io/broker-url annotation, give it again
  kubectl migrate recover x7k2p --broker-url amqp://user:pass@rabbitmq.example:5672/

  # List migrations, interrupted ones with the command that recovers each
  kubectl migrate report`

// RecoverOptions are the options of kubectl migrate recover.
type RecoverOptions struct {
	*RootOptions
	BrokerURL      string
	BrokerSecret   string
	AgentImage     string
	AgentNamespace string
	Output         string

	namespace string
	id        string
}

// NewCmdRecover returns kubectl migrate recover.
func NewCmdRecover(root *RootOptions) *cobra.Command {
	o := &RecoverOptions{RootOptions: root}
	cmd := &cobra.Command{
		Use:   "recover ID",
		Short: "Finish or undo a migration whose process died",
		Long: `Bring an interrupted migration to a safe end from its journal, without the
process that started it: one past its commit point (the target took over the
primary queue) is completed, any other is rolled back, so that the source
serves again with nothing lost.

kubectl migrate report names every migration that did not end, with this
command. Recovery can itself be interrupted and run again, from any machine
that reaches the cluster and the broker. It first makes sure the migrating
process has stopped: it takes over a lease that process gave up (or whose
process is gone from this machine) at once, and otherwise watches the lease
for its duration (2 minutes), refusing if it is renewed.

More: ` + version.DocsURL("reliability.md"),
		Example: recoverExample,
		Args:    exactlyOne("the migration's ID: " + version.Command() + " recover ID (see " + version.Command() + " report)"),
		RunE:    runE(o),
	}
	cmd.Flags().StringVar(&o.BrokerURL, "broker-url", "", "AMQP URL this machine reaches the broker at (default: the migrated pod's ms2m.io/broker-url annotation)")
	cmd.Flags().StringVar(&o.BrokerSecret, "broker-secret", "", "Secret in the migration's namespace with the broker's username and password keys (default: the migrated pod's ms2m.io/broker-secret annotation); or set $"+brokerPasswordEnv)
	cmd.Flags().StringVar(&o.AgentNamespace, "agent-namespace", agent.DefaultNamespace, "namespace the migration's agents ran in (never the one a journal names)")
	cmd.Flags().StringVar(&o.AgentImage, "agent-image", version.AgentImage(), "image of the node-side agent recovery runs (never the one a journal names: anyone who may edit the namespace's ConfigMaps could write it)")
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "output format of the result: name, "+outputFormats+" (default: the report)")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(append([]string{outputName}, outputCompletions...), cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Complete resolves the namespace.
func (o *RecoverOptions) Complete(args []string) error {
	o.id = args[0]
	var err error
	o.namespace, _, err = o.ConfigFlags.ToRawKubeConfigLoader().Namespace()
	return err
}

// Validate checks the flags.
func (o *RecoverOptions) Validate() error { return validateNamedOutput(o.Output) }

// Run recovers the migration.
func (o *RecoverOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	rec, err := report.Store{Client: client}.Get(ctx, o.namespace, o.id)
	if err == nil && rec.Drain != nil {
		return o.recoverDrain(ctx, client, rec)
	}
	rec, err = o.recoverOne(ctx, client, o.namespace, o.id, rec, err)
	if rec == nil {
		return err
	}
	if err != nil && !rec.Outcome.Final() {
		err = withCode(ExitRecover, err) // the journal is kept: recover again
	}
	if printErr := o.printRecord(rec, o.Output); printErr != nil && err == nil {
		err = printErr
	}
	return err
}

// recoverOne recovers migration id, whose record Get returned as rec and
// getErr; it returns a nil record when there was nothing to print.
func (o *RecoverOptions) recoverOne(ctx context.Context, client kubernetes.Interface, namespace, id string, rec *report.Record, getErr error) (*report.Record, error) {
	err := getErr
	if errors.Is(err, report.ErrNotFound) {
		// Stopped in setup, before its first change: at most its
		// leases are left.
		n, lerr := lease.ReleaseStale(ctx, client, namespace, id)
		if lerr != nil {
			return nil, lerr
		}
		if n > 0 {
			fmt.Fprintf(o.ErrOut, "migration %s stopped before it changed anything; released its %d lease(s)\n", id, n)
			return nil, nil
		}
	}
	if err != nil {
		return nil, err
	}
	j, ok, err := migrate.ReadJournal(rec)
	if err != nil {
		return nil, err
	}
	if !ok {
		if rec.Outcome.Final() {
			fmt.Fprintf(o.ErrOut, "migration %s %s: nothing to recover\n", rec.ID, rec.Outcome)
			return nil, nil
		}
		return nil, fmt.Errorf("migration %s (%s) keeps no journal to recover from", rec.ID, rec.Outcome)
	}
	url, err := o.recoveryBrokerURL(ctx, client, rec, j)
	if err != nil {
		return nil, err
	}
	var pullSecrets []corev1.LocalObjectReference
	if j.State.Source != nil {
		pullSecrets = j.State.Source.Spec.ImagePullSecrets
	}
	cfg := j.Config
	cfg.AgentImage, cfg.AgentNamespace = o.AgentImage, o.AgentNamespace
	deps, err := o.NewDeps(ctx, client, cfg, pullSecrets)
	if err != nil {
		return nil, err
	}
	hint := "the journal is kept; run " + migrate.RecoverCommand(rec.Namespace, rec.ID) + " again"
	o.recoverHint.Store(&hint)
	st := newStatus(o.RootOptions)
	return migrate.Recover(ctx, rec, url, deps, st.hooks(""))
}

// recoverDrain recovers each migration of a drain whose process died, then
// ends the drain's record; pods it had not started stay on the node, which
// stays cordoned (run the drain again for them).
func (o *RecoverOptions) recoverDrain(ctx context.Context, client kubernetes.Interface, drain *report.Record) error {
	if err := lease.DrainEnded(ctx, client, drain.Namespace, drain.Pod, drain.ID); err != nil {
		return err
	}
	store := report.Store{Client: client}
	var errs []error
	for i, m := range drain.Drain.Moves {
		if m.Migration == "" || m.Outcome != report.Running {
			continue
		}
		fmt.Fprintf(o.ErrOut, "recovering %s/%s (migration %s)\n", m.Namespace, m.Pod, m.Migration)
		rec, err := store.Get(ctx, m.Namespace, m.Migration)
		if errors.Is(err, report.ErrNotFound) {
			// It died in setup, before its first change.
			_, err = lease.ReleaseStale(ctx, client, m.Namespace, m.Migration)
			drain.Drain.Moves[i].Outcome = report.NotStarted
			errs = append(errs, err)
			continue
		}
		rec, err = o.recoverOne(ctx, client, m.Namespace, m.Migration, rec, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s/%s: %w", m.Namespace, m.Pod, err))
			drain.Drain.Moves[i].Error = err.Error()
			continue
		}
		if rec != nil {
			drain.Drain.Moves[i].Outcome = rec.Outcome
		}
	}
	if _, err := lease.ReleaseStale(ctx, client, drain.Namespace, drain.ID); err != nil {
		errs = append(errs, err)
	}
	drain.Outcome = drain.Drain.Outcome()
	if err := store.Save(ctx, drain); err != nil {
		errs = append(errs, err)
	}
	if drain.Outcome != report.Succeeded {
		fmt.Fprintf(o.ErrOut, "node %s stays cordoned; run %s node %s again for the pods left, or kubectl uncordon %s\n", drain.Pod, version.Command(), drain.Pod, drain.Pod)
	}
	if err := o.printRecord(drain, o.Output); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// recoveryBrokerURL is the broker URL, with its password, that recovering
// migration rec (journal j) talks to: the flag's, or the journal's with the
// secret's or the environment's password, or a live pod's annotation. A
// migration without the MS2M contract has no broker.
func (o *RecoverOptions) recoveryBrokerURL(ctx context.Context, client kubernetes.Interface, rec *report.Record, j migrate.Journal) (string, error) {
	if !j.Config.Strategy.Contract() {
		return "", nil
	}
	url := o.BrokerURL
	secret := o.BrokerSecret
	if secret == "" && j.State.Source != nil {
		secret = j.State.Source.Annotations[migrate.BrokerSecretAnnotation]
	}
	if url == "" && (secret != "" || o.getenv(brokerPasswordEnv) != "") {
		url = j.Config.Broker.URL // without its password, which the secret or the environment gives
	}
	if url == "" {
		// The journal keeps no password: the migration's live pods (or
		// StatefulSet) still carry it in their annotation.
		url = migrate.LiveBrokerURL(ctx, client, j)
		if err := broker.CheckAnnotatedURL(url); err != nil {
			return "", fmt.Errorf("pod %s's %s annotation %w; pass --broker-url to use them", rec.Pod, migrate.BrokerURLAnnotation, err)
		}
	}
	if url == "" {
		return "", fmt.Errorf("the journal keeps no broker password and no live pod of migration %s has it in its %s annotation; pass --broker-secret, set %s, or pass --broker-url", rec.ID, migrate.BrokerURLAnnotation, brokerPasswordEnv)
	}
	return o.brokerCredentials(ctx, client, rec.Namespace, secret, url)
}
