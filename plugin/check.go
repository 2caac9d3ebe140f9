package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/check"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/drain"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report/render"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

const checkExample = `  # Before the first migration from node-a to node-b, through a registry
  kubectl migrate check --from node-a --to node-b --registry registry.example:5000/checkpoints

  # Without a registry: the checkpoint goes node to node (always so where the
  # kubectl-migrate runtime restores)
  kubectl migrate check --from node-a --to node-b

  # A private registry: the credentials the agent pushes with
  kubectl migrate check --from node-a --to node-b --registry registry.example:5000/checkpoints \
    --registry-secret regcred

  # Which pods of the namespace can move, how, and why the others cannot
  kubectl migrate check --pods
  kubectl migrate check --pods -A --node node-a

  # Machine-readable, e.g. for a cluster's conformance job
  kubectl migrate check --from node-a --to node-b --registry registry.example:5000/checkpoints -o json`

// CheckOptions are the options of kubectl migrate check.
type CheckOptions struct {
	*RootOptions
	From, To         string
	Registry         string
	RegistrySecret   string
	InsecureRegistry bool
	Transfer         string
	Restore          string
	AgentImage       string
	AgentNamespace   string
	Timeout          time.Duration
	Output           string
	// Pods lists the pods instead, each with whether and how it moves.
	Pods          bool
	AllNamespaces bool
	Node          string

	namespace string
}

// NewCmdCheck returns kubectl migrate check.
func NewCmdCheck(root *RootOptions) *cobra.Command {
	o := &CheckOptions{RootOptions: root}
	cmd := &cobra.Command{
		Use:   "check --from NODE --to NODE [--registry REPO] | --pods",
		Short: "Prove that a migration between two nodes can work, without a workload",
		Long: `Prove, in seconds and without touching a workload, that pods can be migrated
from one node to another: a small canary (the agent image in canary mode, with
its state in memory and an established TCP connection) is started on --from,
checkpointed through the kubelet, sent the way migrations will send it (pushed
to --registry, or node to node without one) and restored on --to, where it
must go on as the same process.

Each link a migration relies on is reported with ✓ or ✗ and, for a ✗, what to
change (RBAC, runtimes, agent image, CRIU, transfer, pull, restore).
Everything it created is removed again. It exits 6 if a link fails. With
--pods it lists instead which pods can move, how, and why the others cannot;
for one without the MS2M contract, the freeze its clients will wait, from
its memory (metrics.k8s.io, or at most its limit) and earlier such moves.

More: ` + version.DocsURL("check.md"),
		Example: checkExample,
		Args:    noArgs,
		RunE:    runE(o),
	}
	fs := cmd.Flags()
	fs.StringVar(&o.From, "from", "", "the node pods will be migrated from (required)")
	fs.StringVar(&o.To, "to", "", "the node pods will be migrated to (required)")
	fs.StringVar(&o.Registry, "registry", "", "repository for checkpoint images, as migrations will use it (default: none, the checkpoint goes node to node)")
	fs.StringVar(&o.RegistrySecret, "registry-secret", "", "dockerconfigjson secret the agent pushes with and the node pulls with")
	fs.BoolVar(&o.InsecureRegistry, "insecure-registry", false, "allow a plain-HTTP or self-signed registry")
	fs.StringVar(&o.Transfer, "transfer", "", "registry: push to --registry; direct: node to node, no registry (default: registry when --registry is given, else direct)")
	fs.StringVar(&o.Restore, "restore", string(migrate.RestoreAuto), "cri: the target's container runtime restores; runtime: the kubectl-migrate runtime does; auto: as a migration picks")
	fs.StringVar(&o.AgentImage, "agent-image", version.AgentImage(), "image of the node-side agent (also the canary)")
	addAgentNamespaceFlag(fs, &o.AgentNamespace)
	fs.BoolVar(&o.Pods, "pods", false, "list the namespace's pods (-A: all), each with whether and how it would move, instead of checking nodes")
	fs.BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "with --pods: the pods of every namespace")
	fs.StringVar(&o.Node, "node", "", "with --pods: only the pods on this node")
	fs.DurationVar(&o.Timeout, "timeout", 3*time.Minute, "time limit of the check (cleanup gets its own)")
	fs.StringVarP(&o.Output, "output", "o", "", "output format of the result: "+outputFormats+" (default: one line per link)")
	_ = cmd.RegisterFlagCompletionFunc("from", completeNodes(root))
	_ = cmd.RegisterFlagCompletionFunc("to", completeNodes(root))
	_ = cmd.RegisterFlagCompletionFunc("node", completeNodes(root))
	_ = cmd.RegisterFlagCompletionFunc("transfer", cobra.FixedCompletions([]string{"registry", "direct"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("restore", cobra.FixedCompletions([]string{"auto", "cri", "runtime"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputCompletions, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Complete resolves the namespace and the transfer.
func (o *CheckOptions) Complete([]string) error {
	if o.Transfer == "" {
		o.Transfer = string(migrate.Direct)
		if strings.TrimSpace(o.Registry) != "" {
			o.Transfer = string(migrate.ViaRegistry)
		}
	}
	var err error
	o.namespace, _, err = o.ConfigFlags.ToRawKubeConfigLoader().Namespace()
	return err
}

// Validate checks the flags before anything talks to the cluster.
func (o *CheckOptions) Validate() error {
	if o.Pods {
		switch {
		case o.From != "" || o.To != "":
			return errors.New("--pods lists pods, --from and --to check nodes: give one or the other")
		}
		return validateNamedOutput(o.Output)
	}
	switch {
	case o.AllNamespaces || o.Node != "":
		return errors.New("-A and --node go with --pods")
	case o.From == "" || o.To == "":
		return errors.New("give both nodes: " + version.Command() + " check --from NODE --to NODE")
	case o.From == o.To:
		return fmt.Errorf("--from and --to are both %s; give two nodes", o.From)
	case !slices.Contains(migrate.Transfers, migrate.Transfer(o.Transfer)):
		return fmt.Errorf("--transfer must be one of %v, not %q", migrate.Transfers, o.Transfer)
	case !slices.Contains(migrate.Restores, migrate.Restore(o.Restore)):
		return fmt.Errorf("--restore must be one of %v, not %q", migrate.Restores, o.Restore)
	case o.Transfer == string(migrate.ViaRegistry) && strings.TrimSpace(o.Registry) == "":
		return errors.New("--transfer registry needs --registry, the repository migrations push checkpoint images to (e.g. registry.example:5000/checkpoints)")
	case o.Transfer == string(migrate.ViaRegistry) && o.Restore == string(migrate.RestoreRuntime):
		return errors.New("--restore runtime sends the checkpoint node to node, with no registry: drop --transfer registry and --registry")
	case o.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, not %s", o.Timeout)
	case validateOutput(o.Output) != nil:
		return validateOutput(o.Output)
	}
	return nil
}

// errCheckFailed makes the exit status non-zero once the result is printed.
var errCheckFailed = errors.New("the check failed; see the ✗ above")

// Run checks the two nodes and prints every link, or lists the pods.
func (o *CheckOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	if o.Pods {
		return o.listPods(ctx, client)
	}
	// An API server out of reach is not a ✗ of the nodes: one line, exit 1.
	if err := kube.Reach(ctx, client, o.namespace, 30*time.Second); err != nil {
		return err
	}
	id := rand.String(5)
	cfg := check.Config{
		ID: id, Namespace: o.namespace, From: o.From, To: o.To,
		ImageRepository: strings.TrimSuffix(o.Registry, "/"), RegistrySecret: o.RegistrySecret,
		InsecureRegistry: o.InsecureRegistry, AgentImage: o.AgentImage, AgentNamespace: o.AgentNamespace,
		Transfer: migrate.Transfer(o.Transfer), Restore: migrate.Restore(o.Restore),
	}
	// The agents carry the check's label, so that cleanup finds them.
	deps, err := o.NewDeps(ctx, client, migrate.Config{
		ID: check.MigrationID(id), Namespace: o.namespace, AgentImage: o.AgentImage, AgentNamespace: o.AgentNamespace,
		RegistrySecret: o.RegistrySecret, InsecureRegistry: o.InsecureRegistry,
	}, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	// Links are printed as they end, a spinner beside the one that runs:
	// the human form on stdout, or, with -o, as progress on stderr.
	out := o.Out
	if o.Output != "" {
		out = o.ErrOut
	}
	quiet := o.Output != "" && o.Quiet
	s := newStatusOn(o.RootOptions, out, quiet)
	s.printLine(render.ChecklistHeader(version.Command()+" check", o.From+" → "+o.To))
	result := check.Run(ctx, cfg, deps, check.Hooks{
		LinkStarted: s.begin,
		LinkEnded: func(l check.Link) {
			s.end()
			s.printLine(render.ChecklistItem(linkItem(l)))
		},
	})
	if o.Output != "" {
		err = printData(o.Out, o.Output, result)
	} else {
		s.printLine(render.ChecklistVerdict(result.OK(),
			fmt.Sprintf("a migration from %s to %s can work", o.From, o.To),
			fmt.Sprintf("a migration from %s to %s would fail: fix the first ✗ and check again", o.From, o.To), result.Millis))
	}
	if err == nil && !result.OK() {
		err = withCode(ExitCheckFailed, errCheckFailed)
		if quiet {
			err = withCode(ExitCheckFailed, errors.New("the check failed; run it without -q to see which link"))
		}
	}
	return err
}

// listPods prints, for each pod of the namespace (or all, or of one node),
// whether and how it would move and why not.
func (o *CheckOptions) listPods(ctx context.Context, client kubernetes.Interface) error {
	namespace := o.namespace
	if o.AllNamespaces {
		namespace = ""
	}
	opts := metav1.ListOptions{}
	if o.Node != "" {
		opts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.Node).String()
	}
	pods, err := client.CoreV1().Pods(namespace).List(ctx, opts)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	rows := []drain.Movability{} // [] for none in -o json, not null
	var listed []*corev1.Pod
	for i := range pods.Items {
		if o.Node == "" || pods.Items[i].Spec.NodeName == o.Node {
			rows = append(rows, drain.Movable(&pods.Items[i]))
			listed = append(listed, &pods.Items[i])
		}
	}
	if o.Output != outputName {
		drain.PredictFreezes(ctx, client, namespace, rows, listed)
	}
	switch {
	case o.Output == outputName: // the pods that can move, for xargs
		for _, r := range rows {
			if r.Moves {
				fmt.Fprintln(o.Out, "pod/"+r.Pod)
			}
		}
		return nil
	case o.Output != "":
		return printData(o.Out, o.Output, rows)
	case len(rows) == 0:
		_, err := fmt.Fprintln(o.ErrOut, "No pods found.")
		return err
	}
	tw := printers.GetNewTabWriter(o.Out)
	header := "NAME\tNODE\tMOVES\tHOW, OR WHY NOT"
	if o.AllNamespaces {
		header = "NAMESPACE\t" + header
	}
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		moves, how := "no", r.Why
		if r.Moves {
			moves, how = "yes", r.How
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s", r.Pod, cmp.Or(r.Node, "<none>"), moves, how)
		if o.AllNamespaces {
			line = r.Namespace + "\t" + line
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// linkItem is how a link of the check is drawn.
func linkItem(l check.Link) render.Item {
	it := render.Item{Name: l.Name, Detail: l.Detail, Remedy: l.Remedy, Millis: l.Millis, NameWidth: 16}
	switch l.Status {
	case check.Failed:
		it.State = render.Failed
	case check.Skipped:
		it.State, it.Detail = render.Skipped, ""
	}
	return it
}
