package plugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/nodesetup"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

const nodeSetupExample = `  # What it would do on every node, changing nothing
  kubectl migrate node-setup --all --dry-run

  # Install the kubectl-migrate runtime on two nodes (it shows the plan and asks)
  kubectl migrate node-setup node-a node-b

  # From a script: no question
  kubectl migrate node-setup node-a node-b --yes

  # On every node; then migrate onto nodes whose runtime cannot restore
  kubectl migrate node-setup --all
  kubectl migrate pod consumer --to node-b --restore runtime

  # Remove it again: the nodes are as they were
  kubectl migrate node-setup --all --uninstall

  # Only the agents' controller, which every migration needs (the CRI
  # restore path needs no runtime on the nodes)
  kubectl migrate node-setup --agents-only`

var nodeSetupLong = `Install the kubectl-migrate runtime on nodes, for runtimes that no longer
restore checkpoints through the CRI (containerd 2.4 removed it; CRI-O can be
set to checkpoint only). On each node, one at a time, a privileged agent pod
installs the runtime's binary under /opt/kubectl-migrate, registers the
kubectl-migrate handler in a drop-in file of the node's runtime (containerd
2.x: /etc/containerd/conf.d, which its config.toml must import; CRI-O:
/etc/crio/crio.conf.d), and restarts the runtime (through systemd, or with
SIGTERM where a supervisor restarts it; running containers keep running),
then checks that the runtime lists the handler. The node gets the label
kubectl-migrate.io/runtime, which the RuntimeClass kubectl-migrate selects.
--uninstall undoes each step. It shows the plan and asks first (--yes: no
question; --dry-run: the plan alone). It also installs the agents'
controller, which builds every migration's node agents (--agents-only).

More: ` + version.DocsURL("runtime.md")

// NodeSetupOptions are the options of kubectl migrate node-setup.
type NodeSetupOptions struct {
	*RootOptions
	All            bool
	Uninstall      bool
	Restart        string
	AgentImage     string
	AgentNamespace string
	Yes            bool
	DryRun         bool
	AgentsOnly     bool
	APIServer      string

	nodes []string
}

// stdinIsTerminal says whether in is a terminal a person can answer on;
// tests replace it.
var stdinIsTerminal = func(in io.Reader) bool {
	f, ok := in.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// NewCmdNodeSetup returns kubectl migrate node-setup.
func NewCmdNodeSetup(root *RootOptions) *cobra.Command {
	o := &NodeSetupOptions{RootOptions: root}
	cmd := &cobra.Command{
		Use:     "node-setup [NODE...] [--all]",
		Short:   "Install the kubectl-migrate runtime on nodes (or --uninstall it)",
		Long:    nodeSetupLong,
		Example: nodeSetupExample,
		RunE:    runE(o),
	}
	f := cmd.Flags()
	f.BoolVar(&o.All, "all", false, "every node of the cluster")
	f.BoolVar(&o.Uninstall, "uninstall", false, "remove the runtime, its handler and label; the RuntimeClass once no node has it")
	f.StringVar(&o.Restart, "restart", nodesetup.RestartAuto, "how the node's container runtime is restarted: systemd (its unit, over D-Bus), signal (SIGTERM, for supervisors that restart it), auto (systemd where it runs the node)")
	_ = cmd.RegisterFlagCompletionFunc("restart", cobra.FixedCompletions([]string{nodesetup.RestartAuto, nodesetup.RestartSystemd, nodesetup.RestartSignal}, cobra.ShellCompDirectiveNoFileComp))
	f.StringVar(&o.AgentImage, "agent-image", version.AgentImage(), "image of the node-side agent, whose binary is the runtime")
	f.StringVar(&o.AgentNamespace, "agent-namespace", agent.DefaultNamespace, "namespace the setup pods run in")
	f.BoolVarP(&o.Yes, "yes", "y", false, "restart the nodes' runtimes without asking")
	f.BoolVar(&o.DryRun, "dry-run", false, "show the plan and change nothing")
	f.StringVar(&o.APIServer, "api-server", os.Getenv("KUBECTL_MIGRATE_API_SERVER"), "HOST:PORT (or https://HOST:PORT) where the agents' controller reaches the API server, for clusters whose pods cannot reach the kubernetes Service (default: that Service; $KUBECTL_MIGRATE_API_SERVER)")
	f.BoolVar(&o.AgentsOnly, "agents-only", false, "install only the agents' controller (every cluster needs it once; node-setup installs it with the runtime too), no runtime on any node")
	return cmd
}

// Complete takes the node names.
func (o *NodeSetupOptions) Complete(args []string) error {
	o.nodes = args
	o.APIServer = strings.TrimPrefix(o.APIServer, "https://")
	return nil
}

// Validate checks the flags.
func (o *NodeSetupOptions) Validate() error {
	if _, _, err := net.SplitHostPort(o.APIServer); o.APIServer != "" && err != nil {
		return fmt.Errorf("--api-server %q is not HOST:PORT: %v", o.APIServer, err)
	}
	switch {
	case o.AgentsOnly && (o.All || len(o.nodes) > 0 || o.Uninstall):
		return errors.New("--agents-only installs the agents' controller alone: name no node, and pass neither --all nor --uninstall")
	case o.AgentsOnly:
		return nil
	case o.All && len(o.nodes) > 0:
		return errors.New("name nodes or pass --all, not both")
	case !o.All && len(o.nodes) == 0:
		return errors.New("name the nodes to set up, or pass --all: " + version.Command() + " node-setup NODE... ")
	case !slices.Contains([]string{nodesetup.RestartAuto, nodesetup.RestartSystemd, nodesetup.RestartSignal}, o.Restart):
		return fmt.Errorf("--restart must be auto, systemd or signal, not %q", o.Restart)
	case !o.Yes && !o.DryRun && !stdinIsTerminal(o.In):
		return errors.New("node-setup restarts each node's container runtime and there is no terminal to ask on: pass --yes to go ahead, or --dry-run to see the plan")
	}
	return nil
}

// errNotConfirmed is a plan its user did not accept.
var errNotConfirmed = errors.New("not confirmed: nothing was changed")

// plan says what Run will do to nodes, in order.
func (o *NodeSetupOptions) plan(nodes []corev1.Node) string {
	var b strings.Builder
	verb := "install the kubectl-migrate runtime on"
	if o.Uninstall {
		verb = "remove the kubectl-migrate runtime from"
	}
	fmt.Fprintf(&b, "node-setup will %s %d node(s), one at a time:\n", verb, len(nodes))
	for _, n := range nodes {
		runtime, _, _ := strings.Cut(n.Status.NodeInfo.ContainerRuntimeVersion, "://")
		if o.Uninstall {
			fmt.Fprintf(&b, "  %s (%s): remove the label %s, the handler's drop-in and /opt/kubectl-migrate; restart %s (--restart %s); wait until Ready without the handler\n",
				n.Name, n.Status.NodeInfo.ContainerRuntimeVersion, ociruntime.NodeLabel, runtime, o.Restart)
			continue
		}
		_, has := n.Labels[ociruntime.NodeLabel]
		again := ""
		if has {
			again = " (installed already: installed again, this version)"
		}
		fmt.Fprintf(&b, "  %s (%s)%s: install /opt/kubectl-migrate, add the %s handler to %s's drop-in config, restart %s (--restart %s); wait until Ready with the handler; label %s\n",
			n.Name, n.Status.NodeInfo.ContainerRuntimeVersion, again, ociruntime.HandlerName, runtime, runtime, o.Restart, ociruntime.NodeLabel)
	}
	if o.Uninstall {
		fmt.Fprintf(&b, "then, once no node has it: delete RuntimeClass %s and its admission policy.\n", ociruntime.HandlerName)
		b.WriteString("It refuses, before any change, while pods run under that RuntimeClass on these nodes.\n")
	} else {
		fmt.Fprintf(&b, "first, once: RuntimeClass %s and the admission policy that admits pods under it only from who may migrate in their namespace.\n", ociruntime.HandlerName)
	}
	b.WriteString("Running containers keep running; each node reports NotReady for a few seconds while its runtime restarts.\n")
	return b.String()
}

// confirm shows the plan and asks, unless --yes or --dry-run (which only
// shows it); false means stop.
func (o *NodeSetupOptions) confirm(nodes []corev1.Node) (bool, error) {
	plan := o.plan(nodes)
	switch {
	case o.DryRun:
		_, err := fmt.Fprint(o.Out, plan+"Nothing was changed (--dry-run).\n")
		return false, err
	case o.Yes:
		return true, nil
	}
	fmt.Fprint(o.ErrOut, plan+"Go ahead? [y/N] ")
	answer, err := bufio.NewReader(o.In).ReadString('\n')
	if err != nil && answer == "" {
		fmt.Fprintln(o.ErrOut)
		return false, errNotConfirmed
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true, nil
	}
	return false, errNotConfirmed
}

// Run sets up each node, one at a time: a runtime restarting on one node
// at a time leaves the others undisturbed.
func (o *NodeSetupOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	if o.AgentsOnly {
		if o.DryRun {
			_, err := fmt.Fprintf(o.Out, "Would install the agents' controller in namespace %s with image %s.\n", o.AgentNamespace, o.AgentImage)
			return err
		}
		return ensureAgentsController(ctx, client, o.AgentNamespace, o.AgentImage, o.APIServer, o.ErrOut)
	}
	var nodes []corev1.Node
	if o.All {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		nodes = list.Items
	} else {
		for _, name := range o.nodes {
			n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("node %s not found; list nodes with kubectl get nodes", name)
			}
			if err != nil {
				return err
			}
			nodes = append(nodes, *n)
		}
	}
	if err := agent.CheckNamespace(ctx, client, o.AgentNamespace); err != nil {
		return err
	}
	switch ok, err := o.confirm(nodes); {
	case errors.Is(err, errNotConfirmed):
		return withCode(ExitRefused, err)
	case err != nil || !ok:
		return err
	}
	id := "setup-" + rand.String(5)
	launcher := agent.Launcher{
		Client:    client,
		Image:     o.AgentImage,
		Namespace: o.AgentNamespace,
		ID:        id,
		Labels:    map[string]string{"app.kubernetes.io/name": "kubectl-migrate-agent", migrate.MigrationLabel: id},
	}
	defer func() { _ = launcher.Release(context.WithoutCancel(ctx)) }()
	cluster := nodesetup.Cluster{
		Client: client,
		OnNode: func(ctx context.Context, node, runtime string, args []string) (string, error) {
			return launcher.NodeSetup(ctx, "kubectl-migrate-"+id+"-"+node, node, runtime, args)
		},
		Admission: admissionPolicy,
		Restart:   o.Restart,
		Progress:  o.ErrOut,
	}
	if o.Uninstall {
		return cluster.Uninstall(ctx, nodes)
	}
	if err := ensureAgentsController(ctx, client, o.AgentNamespace, o.AgentImage, o.APIServer, o.ErrOut); err != nil {
		return err
	}
	return cluster.Install(ctx, nodes)
}
