package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/drain"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report/render"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

const nodeExample = `  # See what a drain of node-a would do: which pod goes where, how, and what stays
  kubectl migrate node node-a --to node-b --dry-run

  # Drain node-a onto node-b, two migrations at once
  kubectl migrate node node-a --to node-b --parallel 2

  # Any node labelled pool=stateful; StatefulSet pods through a shadow copy
  kubectl migrate node node-a --to-selector pool=stateful --mode shadow

  # Then hand what cannot move to the eviction API, as kubectl drain would
  kubectl migrate node node-a --to node-b --evict-rest`

// NodeOptions are the options of kubectl migrate node.
type NodeOptions struct {
	migrationFlags

	ToSelector   string
	Parallel     int
	Mode         string
	FailFast     bool
	EvictRest    bool
	KeepCordoned bool

	node          string
	allNamespaces bool
	selector      labels.Selector
}

// NewCmdNode returns kubectl migrate node.
func NewCmdNode(root *RootOptions) *cobra.Command {
	o := &NodeOptions{migrationFlags: migrationFlags{RootOptions: root}}
	cmd := &cobra.Command{
		Use:   "node NODE [--to NODE | --to-selector LABELS]",
		Short: "Drain a node by live-migrating what can move",
		Long: `Drain a node the way kubectl drain does, but move its pods alive instead
of evicting them: the node is cordoned and every pod on it that CRIU can
checkpoint is migrated with its state (bare and Deployment pods as kubectl
migrate pod does, StatefulSet pods as kubectl migrate sts does), each with its
own strategy (MS2M for a pod with the contract's ms2m.io/* annotations,
checkpoint/restore, connections reset, for any other; --strategy for all), to
the fitting node (of --to or --to-selector) with the most CPU left. --parallel
moves run at once, never two of one StatefulSet or ReplicaSet nor more of a
PodDisruptionBudget than it allows. What cannot move is listed with the reason
and left (--evict-rest evicts it afterwards). A failed move is rolled back and
the drain goes on (--fail-fast stops it; a drain stopped early uncordons the
node unless --keep-cordoned). --dry-run prints the plan. Pods of every
namespace, or of -n; the record and lease stay in the current namespace.

More: ` + version.DocsURL("drain.md"),

		Example:           nodeExample,
		Args:              exactlyOne("the node to drain: " + version.Command() + " node NODE"),
		ValidArgsFunction: completeNodes(root),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.allNamespaces = !cmd.Flags().Changed("namespace")
			return runE(o)(cmd, args)
		},
	}
	o.add(cmd)
	fs := cmd.Flags()
	// A drain reads each pod's queue and moves all its containers: these
	// stay only to refuse with the reason, out of --help.
	_ = fs.MarkHidden("queue")
	_ = fs.MarkHidden("container")
	fs.Lookup("to").Usage = "the node to move pods to (default: any Ready, schedulable node that fits each)"
	fs.StringVar(&o.ToSelector, "to-selector", "", "label selector of the nodes to move pods to, e.g. pool=stateful")
	fs.IntVar(&o.Parallel, "parallel", 2, "migrations at once")
	fs.StringVar(&o.Mode, "mode", string(migrate.Sequential), "StatefulSet pods: sequential or shadow")
	fs.BoolVar(&o.FailFast, "fail-fast", false, "stop starting migrations once one fails")
	fs.BoolVar(&o.EvictRest, "evict-rest", false, "afterwards, evict the pods that did not move, as kubectl drain would")
	fs.BoolVar(&o.KeepCordoned, "keep-cordoned", false, "leave the node cordoned when the drain stops early")
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{string(migrate.Sequential), string(migrate.Shadow)}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Complete takes the node and parses the selector.
func (o *NodeOptions) Complete(args []string) error {
	o.node = args[0]
	if err := o.complete(""); err != nil {
		return err
	}
	if o.ToSelector != "" {
		sel, err := labels.Parse(o.ToSelector)
		if err != nil {
			return fmt.Errorf("--to-selector %q is not a label selector: %v", o.ToSelector, err)
		}
		o.selector = sel
	}
	return nil
}

// Validate checks the flags with the engine's own rules, for both kinds of
// pod, before anything talks to the cluster.
func (o *NodeOptions) Validate() error {
	switch {
	case o.To != "" && o.ToSelector != "":
		return errors.New("give --to or --to-selector, not both")
	case o.To == o.node:
		return fmt.Errorf("--to %s is the node being drained; pick another", o.To)
	case o.Parallel < 1:
		return fmt.Errorf("--parallel must be at least 1, not %d", o.Parallel)
	case o.Queue != "" || len(o.Containers) > 0:
		return errors.New("--queue and --container name one pod's; a drain reads each pod's ms2m.io/queue annotation (a StatefulSet's may say $(POD_NAME)) and moves all its containers")
	}
	for _, sts := range []string{"", "x"} {
		c, err := o.configFor(drain.Move{Pod: &corev1.Pod{}, StatefulSet: sts, Target: "planned"}, "")
		if err != nil {
			return err
		}
		if err := c.ValidateChoices(); err != nil {
			return err
		}
	}
	return validateNamedOutput(o.Output)
}

// configFor is the engine's config for one move of the drain.
func (o *NodeOptions) configFor(mv drain.Move, id string) (migrate.Config, error) {
	pod := mv.Pod
	if pod.Name == "" {
		pod = nil // validation: the flags alone
	}
	c, err := o.migrationFlags.toConfig(pod, id)
	c.Namespace, c.Pod, c.TargetNode = mv.Pod.Namespace, mv.Pod.Name, mv.Target
	if mv.StatefulSet != "" {
		c.StatefulSet, c.Mode, c.TargetName = mv.StatefulSet, migrate.StatefulSetMode(o.Mode), mv.Pod.Name
	} else if pod != nil {
		c.TargetName = targetName(pod, id)
	}
	withoutRegistry(&c)
	return c, err
}

// Run plans the drain, prints the plan (and stops, with --dry-run), then
// drains and prints the summary.
func (o *NodeOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	namespace := o.namespace
	if o.allNamespaces {
		namespace = ""
	}
	opts := drain.PlanOptions{Namespace: namespace, TargetSelector: o.selector}
	if o.To != "" {
		opts.Targets = []string{o.To}
	}
	plan, err := drain.MakePlan(ctx, client, o.node, opts)
	if err != nil {
		return err
	}
	plan = o.leaveWhatTheFlagsCannotMove(plan)
	id := rand.String(5)
	dcfg := drain.Config{
		ID: id, Namespace: o.namespace, Parallel: o.Parallel, FailFast: o.FailFast,
		KeepCordoned: o.KeepCordoned, EvictRest: o.EvictRest, Targets: firstOf(o.To, o.ToSelector),
		AgentNamespace: o.AgentNamespace, RegistrySecret: o.RegistrySecret,
	}
	// Every access, the migrations' included, before the node is cordoned.
	missing, err := drain.MissingPermissions(ctx, client, dcfg, plan)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return withCode(ExitRefused, fmt.Errorf("missing permissions, grant them with RBAC (docs/rbac.yaml has them all): %s", strings.Join(missing, "; ")))
	}
	if o.DryRun || o.Output == "" {
		if err := o.printDrainPlan(plan, o.predictFreezes(ctx, client, plan)); err != nil || o.DryRun {
			return err
		}
	}
	hint := fmt.Sprintf("the drain's record is %s; %s report lists any pod migration to recover", id, version.Command())
	o.recoverHint.Store(&hint)
	st := newDrainStatus(o.RootOptions, plan)
	labels := map[string]string{"drain": id}
	deps := drain.Deps{
		Client: client, Records: report.Store{Client: client}, NewID: func() string { return rand.String(5) },
		Migrate: func(ctx context.Context, mv drain.Move, mid string) (*report.Record, error) {
			cfg, err := o.configFor(mv, mid)
			if err != nil {
				return nil, err
			}
			if cfg.Broker.URL, err = o.brokerCredentials(ctx, client, cfg.Namespace, brokerSecretOf(o.BrokerSecret, mv.Pod.Annotations), cfg.Broker.URL); err != nil {
				return nil, err
			}
			cfg.Labels = maps.Clone(cfg.Labels)
			if cfg.Labels == nil {
				cfg.Labels = map[string]string{}
			}
			maps.Copy(cfg.Labels, labels)
			mdeps, err := o.NewDeps(ctx, client, cfg, mv.Pod.Spec.ImagePullSecrets)
			if err != nil {
				return nil, err
			}
			return migrate.Run(ctx, cfg, mdeps, st.migrationHooks(mv))
		},
	}
	st.start()
	rec, err := drain.Run(ctx, dcfg, deps, plan, drain.Hooks{Started: st.started, Finished: st.finished})
	st.stop()
	if rec == nil {
		return err
	}
	if printErr := o.RootOptions.printRecord(rec, o.Output); printErr != nil && err == nil {
		err = printErr
	}
	return err
}

// leaveWhatTheFlagsCannotMove moves to the plan's left pods those whose
// migration the engine would refuse with these flags (--strategy ms2m for
// a pod without the contract, shadow mode for one, no registry for a
// checkpoint image), with the engine's reason, so the drain says so before
// it cordons the node instead of failing those moves one by one.
func (o *NodeOptions) leaveWhatTheFlagsCannotMove(plan drain.Plan) drain.Plan {
	moves := plan.Moves[:0:0]
	for _, mv := range plan.Moves {
		c, err := o.configFor(mv, "plan")
		if err == nil {
			err = c.Validate()
		}
		if err != nil {
			reason := strings.ReplaceAll(err.Error(), "\n", "; ")
			plan.Skipped = append(plan.Skipped, drain.Skip{Namespace: mv.Pod.Namespace, Pod: mv.Pod.Name, Reason: reason, Evictable: true})
			continue
		}
		moves = append(moves, mv)
	}
	plan.Moves = moves
	return plan
}

// predictFreezes is the freeze expected for each checkpoint/restore move of
// plan, by its name.
func (o *NodeOptions) predictFreezes(ctx context.Context, client kubernetes.Interface, plan drain.Plan) map[string]*report.Freeze {
	freezes := map[string]*report.Freeze{}
	model := migrate.NewFreezeModel(client, o.namespace)
	for _, mv := range plan.Moves {
		if o.strategy(mv.Pod) == migrate.CheckpointRestore {
			freezes[mv.Name()] = model.Predict(ctx, mv.Pod)
		}
	}
	return freezes
}

// printDrainPlan writes which pod goes where and what stays (on stdout for
// --dry-run, else on stderr before the drain starts), with the freeze
// expected for each checkpoint/restore move.
func (o *NodeOptions) printDrainPlan(plan drain.Plan, freezes map[string]*report.Freeze) error {
	w := o.ErrOut
	if o.DryRun {
		w = o.Out
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Drain of %s: %d pod(s) to migrate (StatefulSet pods %s, %d at once), %d left.\n", plan.Node, len(plan.Moves), o.Mode, o.Parallel, len(plan.Skipped))
	for _, mv := range plan.Moves {
		// Each pod's own strategy: --strategy, or the one its annotations choose.
		how := string(o.strategy(mv.Pod))
		kind := "pod, " + how
		if mv.StatefulSet != "" {
			kind = "sts " + mv.StatefulSet + ", " + how
		}
		extra := ""
		if len(mv.Budgets) > 0 {
			extra = "  (budget " + strings.Join(mv.Budgets, ", ") + ")"
		}
		if f := freezes[mv.Name()]; f != nil {
			extra += "  (" + f.Summary() + ")"
		}
		fmt.Fprintf(&b, "  migrate %s → %s  [%s]%s\n", mv.Name(), mv.Target, kind, extra)
	}
	for _, s := range plan.Skipped {
		then := ""
		if o.EvictRest && s.Evictable {
			then = "; will be evicted"
		}
		fmt.Fprintf(&b, "  leave   %s/%s: %s%s\n", s.Namespace, s.Pod, s.Reason, then)
	}
	if o.DryRun {
		b.WriteString("Nothing was changed (the node was not cordoned).\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// drainStatus shows the whole drain on stderr: on a terminal an overall bar
// and one line per pod with its phase, redrawn; otherwise a line when a pod
// starts and when it ends.
type drainStatus struct {
	w   io.Writer
	tty bool

	mu      sync.Mutex
	names   []string
	lines   map[string]string
	phases  map[string]report.PhaseTiming
	began   map[string]time.Time
	done    int
	failed  int
	t0      time.Time
	drawn   int
	quit    chan struct{}
	stopped sync.WaitGroup
}

func newDrainStatus(o *RootOptions, plan drain.Plan) *drainStatus {
	s := &drainStatus{w: o.colourWriter(o.ErrOut), lines: map[string]string{}, phases: map[string]report.PhaseTiming{}, began: map[string]time.Time{}, quit: make(chan struct{})}
	if o.Quiet {
		s.w = io.Discard
	}
	if f, ok := o.ErrOut.(*os.File); ok && !o.Quiet {
		s.tty = term.IsTerminal(int(f.Fd()))
	}
	for _, mv := range plan.Moves {
		s.names = append(s.names, mv.Name())
		s.lines[mv.Name()] = dimStyle.Render("  · " + mv.Name() + " → " + mv.Target + "  waiting")
	}
	return s
}

func (s *drainStatus) start() {
	s.t0 = time.Now()
	if !s.tty {
		return
	}
	s.stopped.Add(1)
	go func() {
		defer s.stopped.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			s.redraw()
			select {
			case <-s.quit:
				s.redraw()
				return
			case <-tick.C:
			}
		}
	}()
}

func (s *drainStatus) stop() {
	close(s.quit)
	s.stopped.Wait()
}

// redraw writes the block again over the last one.
func (s *drainStatus) redraw() {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	if s.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", s.drawn)
	}
	total := len(s.names)
	const width = 30
	filled := 0
	if total > 0 {
		filled = width * s.done / total
	}
	fmt.Fprintf(&b, "\x1b[2K%s %s%s %d/%d done, %d failed  %s\n", "draining", strings.Repeat("█", filled), strings.Repeat("░", width-filled), s.done, total, s.failed, time.Since(s.t0).Round(100*time.Millisecond))
	for _, n := range s.names {
		line := s.lines[n]
		if p, ok := s.phases[n]; ok {
			line = fmt.Sprintf("  %c %s  %s %s", spinnerFrames[int(time.Since(s.t0)/(100*time.Millisecond))%len(spinnerFrames)], n, p.Label(), dimStyle.Render(time.Since(s.began[n]).Round(100*time.Millisecond).String()))
		}
		fmt.Fprintf(&b, "\x1b[2K%s\n", line)
	}
	s.drawn = 1 + len(s.names)
	_, _ = io.WriteString(s.w, b.String())
}

func (s *drainStatus) started(mv drain.Move, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.began[mv.Name()] = time.Now()
	if !s.tty {
		fmt.Fprintf(s.w, "→ %s to %s (migration %s)\n", mv.Name(), mv.Target, id)
	}
}

func (s *drainStatus) finished(mv drain.Move, r report.DrainMove) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.phases, mv.Name())
	s.done++
	mark, what := doneMark, fmt.Sprintf("%s (downtime %s)", render.FormatMillis(r.TotalMillis), render.FormatMillis(r.DowntimeMillis))
	if r.Outcome != report.Succeeded {
		s.failed++
		mark, what = failMark, string(r.Outcome)
		if r.Error != "" {
			what += ": " + r.Error
		}
	}
	s.lines[mv.Name()] = fmt.Sprintf("  %s %s → %s  %s", mark, mv.Name(), mv.Target, what)
	if !s.tty {
		fmt.Fprintln(s.w, strings.TrimSpace(s.lines[mv.Name()]))
	}
}

// migrationHooks follow one pod's phases.
func (s *drainStatus) migrationHooks(mv drain.Move) migrate.Hooks {
	return migrate.Hooks{PhaseStarted: func(p report.PhaseTiming) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.phases[mv.Name()] = p
	}}
}
