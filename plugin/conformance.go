package plugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/conformance"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report/render"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

const conformanceExample = `  # Check an application image before trusting it with a migration
  kubectl migrate conformance --image registry.example/team/orders:1.4 \
    --broker-url amqp://user:pass@rabbitmq.example:5672/

  # The same, ending with a real live migration from node-a to node-b
  kubectl migrate conformance --image registry.example/team/orders:1.4 \
    --broker-url amqp://user:pass@rabbitmq.example:5672/ \
    --from node-a --to node-b --registry registry.example:5000/checkpoints

  # An application whose messages are not the sample's JSON, started with
  # its own arguments
  kubectl migrate conformance --image registry.example/team/inventory:2 --arg consume \
    --message '{"sku":"sku-01","delta":1}' --broker-url amqp://rabbitmq.example:5672/`

// ConformanceOptions are the options of kubectl migrate conformance.
type ConformanceOptions struct {
	*RootOptions
	Image            string
	Args             []string
	Port             int
	BrokerURL        string
	AppBrokerURL     string
	Message          string
	ContentType      string
	From, To         string
	Registry         string
	InsecureRegistry bool
	AgentImage       string
	AgentNamespace   string
	Timeout          time.Duration
	Keep             bool
	Output           string
}

// NewCmdConformance returns kubectl migrate conformance.
func NewCmdConformance(root *RootOptions) *cobra.Command {
	o := &ConformanceOptions{RootOptions: root}
	cmd := &cobra.Command{
		Use:   "conformance --image IMAGE --broker-url URL",
		Short: "Check that an application image keeps the MS2M contract",
		Long: `Check that an application keeps the MS2M contract (docs/contract.md) before
it is trusted with production state — on its image, not on a live pod.

The image runs in a scratch namespace on scratch queues (MS2M_BROKER_URL,
MS2M_EXCHANGE, MS2M_QUEUE in its environment) and is driven clause by clause
through its HTTP endpoint (--port) and the broker; with --from and --to it
ends with a live migration between the two nodes while messages flow.
Messages carry --message as their body: give one your application applies.
Each clause prints ✓ or ✗ with what the contract says; everything created is
removed (--keep leaves it). It exits 6 if a clause fails.

More: ` + version.DocsURL("contract.md"),
		Example: conformanceExample,
		Args:    noArgs,
		RunE:    runE(o),
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Image, "image", "", "the application's image (required)")
	fs.StringArrayVar(&o.Args, "arg", nil, "an argument to the image's entrypoint (repeat for more)")
	fs.IntVar(&o.Port, "port", 8080, "port of the application's MS2M HTTP endpoint")
	fs.StringVar(&o.BrokerURL, "broker-url", "", "AMQP URL this machine reaches the broker at (required)")
	fs.StringVar(&o.AppBrokerURL, "app-broker-url", "", "AMQP URL the application's pod reaches the broker at (default: --broker-url)")
	fs.StringVar(&o.Message, "message", `{"value":1}`, "body of every message the check publishes: one the application applies")
	fs.StringVar(&o.ContentType, "content-type", "application/json", "content type of --message")
	fs.StringVar(&o.From, "from", "", "node to start the application on (with --to: end with a live migration)")
	fs.StringVar(&o.To, "to", "", "node to migrate the application to (needs --from and --registry)")
	fs.StringVar(&o.Registry, "registry", "", "repository for the migration's checkpoint image, e.g. registry.example:5000/checkpoints")
	fs.BoolVar(&o.InsecureRegistry, "insecure-registry", false, "allow a plain-HTTP or self-signed registry")
	fs.StringVar(&o.AgentImage, "agent-image", version.AgentImage(), "image of the node-side agent the migration uses")
	addAgentNamespaceFlag(fs, &o.AgentNamespace)
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "time limit of the check (cleanup gets its own)")
	fs.BoolVar(&o.Keep, "keep", false, "leave the scratch namespace and queues, for debugging")
	fs.StringVarP(&o.Output, "output", "o", "", "output format of the result: "+outputFormats+" (default: one line per clause)")
	_ = cmd.RegisterFlagCompletionFunc("from", completeNodes(root))
	_ = cmd.RegisterFlagCompletionFunc("to", completeNodes(root))
	return cmd
}

// Complete fills in defaults that depend on other flags.
func (o *ConformanceOptions) Complete([]string) error {
	o.AppBrokerURL = firstOf(o.AppBrokerURL, o.BrokerURL)
	return nil
}

// Validate checks the flags before anything talks to the cluster.
func (o *ConformanceOptions) Validate() error {
	switch {
	case strings.TrimSpace(o.Image) == "":
		return errors.New("give --image, the application image to check")
	case o.BrokerURL == "":
		return errors.New("give --broker-url, the AMQP URL of a broker the check may use for scratch queues")
	case (o.From == "") != (o.To == ""):
		return errors.New("give both --from and --to to end with a live migration, or neither")
	case o.To != "" && o.From == o.To:
		return fmt.Errorf("--from and --to are both %s; give two nodes", o.From)
	case o.To != "" && strings.TrimSpace(o.Registry) == "":
		return errors.New("give --registry for the migration's checkpoint image (e.g. registry.example:5000/checkpoints)")
	case o.Port <= 0 || o.Port > 65535:
		return fmt.Errorf("--port must be a port number, not %d", o.Port)
	case o.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, not %s", o.Timeout)
	case validateOutput(o.Output) != nil:
		return validateOutput(o.Output)
	}
	return nil
}

var errNotConformant = errors.New("the application breaks the contract; see the ✗ above")

// Run starts the application, checks every clause, prints them, and
// removes what it created.
func (o *ConformanceOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	// Clauses are printed as they end: the human form on stdout, or, with
	// -o, as progress on stderr.
	w := o.colourWriter(o.Out)
	if o.Output != "" {
		w = o.colourWriter(o.ErrOut)
	}
	fmt.Fprintln(w, render.ChecklistHeader(version.Command()+" conformance", o.Image))
	runCtx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	scratch, err := conformance.Start(runCtx, client, conformance.PodSpec{
		Image: o.Image, Args: o.Args, Port: o.Port, Node: o.From, BrokerURL: o.AppBrokerURL,
		Registry: strings.TrimSuffix(o.Registry, "/"),
	})
	if scratch != nil {
		defer o.cleanup(scratch)
	}
	if err != nil {
		return fmt.Errorf("start %s: %w", o.Image, err)
	}
	fmt.Fprintln(o.colourWriter(o.ErrOut), render.Dim.Render(fmt.Sprintf("started %s in namespace %s", o.Image, scratch.Namespace)))
	env := conformance.Env{
		App: scratch.App(o.Port), URL: o.BrokerURL, Exchange: scratch.Exchange, Queue: scratch.Queue,
		Body: []byte(o.Message), ContentType: o.ContentType,
	}
	if o.To != "" {
		env.Migrate = func(ctx context.Context) (conformance.App, error) { return o.migrate(ctx, client, scratch) }
	}
	results := conformance.Run(runCtx, env, func(r conformance.Result) { fmt.Fprintln(w, render.ChecklistItem(clauseItem(r))) })
	if o.Output != "" {
		if err := printData(o.Out, o.Output, conformance.Summarise(o.Image, results)); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(w, conformanceVerdict(o.Image, results))
	}
	if conformance.Failed(results) {
		return withCode(ExitCheckFailed, errNotConformant)
	}
	return nil
}

// migrate moves the scratch instance to --to as kubectl migrate pod does,
// and returns the restored instance.
func (o *ConformanceOptions) migrate(ctx context.Context, client kubernetes.Interface, s *conformance.Scratch) (conformance.App, error) {
	pod := &PodOptions{migrationFlags: migrationFlags{
		RootOptions: o.RootOptions, To: o.To, Strategy: string(migrate.MS2M),
		InsecureRegistry: o.InsecureRegistry, AgentImage: o.AgentImage, AgentNamespace: o.AgentNamespace, BrokerURL: o.BrokerURL,
		ReplayTimeout: 2 * time.Minute, PhaseTimeout: 3 * time.Minute, KubeletTimeout: 15 * time.Second,
		CheckpointTimeout: time.Minute, Timeout: o.Timeout,
		// The check's own scratch instance: its memory holds what the
		// check gave it, nothing of a tenant's.
		AllowAnonymous: true,
		namespace:      s.Namespace, pod: s.Pod,
	}, Transfer: string(migrate.ViaRegistry)}
	_, _, record, err := pod.migrate(ctx, client, pod)
	if err != nil {
		outcome := "failed"
		if record != nil {
			outcome = string(record.Outcome)
		}
		return nil, fmt.Errorf("the migration %s: %w", outcome, err)
	}
	return s.AppIn(record.TargetPod, o.Port), nil
}

// cleanup removes the application first (so it redeclares nothing), then
// its queues and its namespace.
func (o *ConformanceOptions) cleanup(s *conformance.Scratch) {
	if o.Keep {
		fmt.Fprintf(o.ErrOut, "kept namespace %s and queue %s for debugging\n", s.Namespace, s.Queue)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.Delete(ctx, o.BrokerURL); err != nil {
		fmt.Fprintf(o.ErrOut, "cleanup: %v; remove namespace %s and the queues %s* by hand\n", err, s.Namespace, s.Queue)
	}
}

// clauseItem is how a clause of the contract is drawn: under a broken one,
// the error and what the contract says.
func clauseItem(r conformance.Result) render.Item {
	switch {
	case r.Skip != "":
		return render.Item{Name: r.Clause, State: render.Skipped, Detail: r.Skip}
	case r.Err != nil:
		return render.Item{Name: r.Clause + ":", State: render.Failed, Detail: r.Err.Error(), Remedy: "the contract: " + r.Spec}
	}
	return render.Item{Name: r.Clause}
}

// conformanceVerdict says whether the image keeps the contract.
func conformanceVerdict(image string, results []conformance.Result) string {
	kept, skipped, broken := 0, 0, false
	for _, r := range results {
		switch {
		case r.Err != nil:
			broken = true
		case r.Skip != "":
			skipped++
		default:
			kept++
		}
	}
	good := fmt.Sprintf("%s keeps the MS2M contract: %d clauses kept", image, kept)
	if skipped > 0 {
		good += fmt.Sprintf(", %d not checked", skipped)
	}
	return render.ChecklistVerdict(!broken, good, fmt.Sprintf("%s breaks the MS2M contract: fix the first ✗ (docs/contract.md) and check again", image), 0)
}
