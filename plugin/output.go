package plugin

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/charmbracelet/colorprofile"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report/render"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// Output formats beside json and yaml, as kubectl spells them: -o name
// (where the result names objects), -o jsonpath=TEMPLATE and
// -o go-template=TEMPLATE over the result's JSON fields.
const (
	outputName       = "name"
	jsonpathPrefix   = "jsonpath="
	goTemplatePrefix = "go-template="
)

// outputCompletions are -o's values for shell completion.
var outputCompletions = []string{"json", "yaml", jsonpathPrefix, goTemplatePrefix}

// outputFormats is what -o takes, for flag help.
const outputFormats = "json, yaml, jsonpath=TEMPLATE or go-template=TEMPLATE"

// validateOutput accepts json, yaml, jsonpath= and go-template= (whose
// template must parse).
func validateOutput(format string) error {
	if format == "" || format == "json" || format == "yaml" {
		return nil
	}
	execute, err := templateOutput(format)
	if execute == nil && err == nil {
		return fmt.Errorf("--output must be %s, not %q", outputFormats, format)
	}
	return err
}

// templateOutput parses a jsonpath= or go-template= format into what
// executes it over data; a format of neither kind gives nil.
func templateOutput(format string) (execute func(w io.Writer, data any) error, err error) {
	switch {
	case strings.HasPrefix(format, jsonpathPrefix):
		jp := jsonpath.New("output")
		if err := jp.Parse(strings.TrimPrefix(format, jsonpathPrefix)); err != nil {
			return nil, err
		}
		return jp.Execute, nil
	case strings.HasPrefix(format, goTemplatePrefix):
		t, err := template.New("output").Parse(strings.TrimPrefix(format, goTemplatePrefix))
		if err != nil {
			return nil, err
		}
		return t.Execute, nil
	}
	return nil, nil
}

// validateNamedOutput is validateOutput with -o name too, for commands
// whose result names an object.
func validateNamedOutput(format string) error {
	if format == outputName {
		return nil
	}
	if err := validateOutput(format); err != nil {
		return fmt.Errorf("--output must be name, %s, not %q", outputFormats, format)
	}
	return nil
}

// exactlyOne requires one argument, naming it in the error.
func exactlyOne(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usageError(cmd, fmt.Errorf("expected one argument, got %d; give %s", len(args), what))
		}
		return nil
	}
}

// noArgs refuses arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError(cmd, fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args))
	}
	return nil
}

// printData writes v as json or yaml, or through a jsonpath or go-template
// over its JSON form (the field names -o json shows).
func printData(w io.Writer, format string, v any) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		out, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
	execute, err := templateOutput(format)
	if err != nil || execute == nil {
		return cmp.Or(err, fmt.Errorf("unknown output format %q", format))
	}
	data, err := asJSONValue(v)
	if err != nil {
		return err
	}
	return execute(w, data)
}

// asJSONValue is v as encoding/json decodes its JSON: maps, slices and
// plain values, so templates name fields as -o json shows them.
func asJSONValue(v any) (any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	err = json.Unmarshal(raw, &out)
	return out, err
}

// recordName is a migration's name for -o name.
func recordName(r *report.Record) string { return "migration/" + r.ID }

func (o *RootOptions) renderOptions(cw *colorprofile.Writer) render.Options {
	return render.Options{Colour: cw.Profile >= colorprofile.ANSI, Now: time.Now()}
}

// writePrediction adds what the dry run expects, and on what it is based.
func writePrediction(b *strings.Builder, p *report.Prediction) {
	if p == nil {
		return
	}
	if p.Freeze != nil {
		fmt.Fprintf(b, "Expected (checkpoint/restore: its clients wait through the freeze, which grows with its memory):\n  %s\n", p.Freeze.Summary())
		return
	}
	basis := fmt.Sprintf("phases from %d recent migration(s) on this cluster", p.FromRuns)
	if p.FromRuns == 0 {
		basis = "no earlier migration of this kind: the critical path is a conservative " + render.FormatMillis(p.CriticalPathMillis)
	}
	fmt.Fprintf(b, "Expected (λ measured for %s on the exchange; %s):\n", render.FormatMillis(p.LambdaWindowMillis), basis)
	mu := "unknown"
	if p.Mu > 0 {
		mu = fmt.Sprintf("%.1f msg/s (from %s)", p.Mu, p.MuFrom)
	}
	fmt.Fprintf(b, "  λ %.1f msg/s, μ %s, critical path %s, backlog at replay ≈ %.0f messages\n", p.Lambda, mu, render.FormatMillis(p.CriticalPathMillis), p.Backlog)
	if p.ReplayMillis > 0 {
		fmt.Fprintf(b, "  replay ≈ backlog / (μ − λ) = %s\n", render.FormatMillis(p.ReplayMillis))
	}
	if p.TotalMillis > 0 {
		fmt.Fprintf(b, "  total ≈ %s", render.FormatMillis(p.TotalMillis))
		if p.DowntimeMillis > 0 {
			fmt.Fprintf(b, ", downtime ≈ %s", render.FormatMillis(p.DowntimeMillis))
		}
		b.WriteString("\n")
	}
	for _, w := range p.Warnings {
		fmt.Fprintf(b, "  ! %s\n", w)
	}
}

// printRecord prints r as data in format, or as the breakdown.
func (o *RootOptions) printRecord(r *report.Record, format string) error {
	if format == outputName {
		_, err := fmt.Fprintln(o.Out, recordName(r))
		return err
	}
	if format != "" {
		return printData(o.Out, format, r)
	}
	cw := o.colourWriter(o.Out)
	return render.Record(cw, r, o.renderOptions(cw))
}

// printPlan describes what the migration would do, after a passing preflight.
func (o *migrationFlags) printPlan(c migrate.Config, source *corev1.Pod, prediction *report.Prediction) error {
	if o.Output == outputName {
		_, err := fmt.Fprintln(o.Out, "pod/"+c.TargetName) // the one object the migration would create
		return err
	}
	if o.Output != "" {
		images := map[string]string{}
		for _, ctr := range source.Spec.Containers {
			images[ctr.Name] = "<" + c.CheckpointImageOf(c.Pod, ctr.Name, c.ID) + ">"
		}
		if len(migrate.CarriedVolumes(source, slices.Collect(maps.Keys(images)))) > 0 {
			images[agent.VolumesKey] = "<" + c.CheckpointImageOf(c.Pod, agent.VolumesKey, c.ID) + ">"
		}
		return printData(o.Out, o.Output, migrate.PlannedTarget(c, source, images))
	}
	var b strings.Builder
	how := string(c.Strategy)
	if c.StatefulSet != "" {
		how += ", " + string(c.Mode) + " mode"
	}
	fmt.Fprintf(&b, "Preflight passed. Plan for %s/%s (%s, migration %s):\n", c.Namespace, c.Pod, how, c.ID)
	containers := c.Containers
	if len(containers) == 0 {
		for _, ctr := range source.Spec.Containers {
			containers = append(containers, ctr.Name)
		}
	}
	for i, step := range migrate.Plan(c, source.Spec.NodeName, containers) {
		fmt.Fprintf(&b, "  %d. %s\n", i+1, step)
	}
	if volumes := migrate.CarriedVolumes(source, containers); len(volumes) > 0 {
		pause := ""
		if c.Strategy == migrate.MS2M {
			pause = " (the source stops consuming meanwhile, so files and memory are of one moment)"
		}
		into := "by an init container"
		if c.Restore == migrate.RestoreRuntime {
			into = "by the kubectl-migrate runtime"
		}
		fmt.Fprintf(&b, "  emptyDir %s move with it: copied on %s as it is checkpointed%s, and into the target's volumes %s before the restore.\n", strings.Join(volumes, ", "), source.Spec.NodeName, pause, into)
	}
	if owner := metav1.GetControllerOf(source); owner != nil && owner.Kind == "ReplicaSet" {
		fmt.Fprintf(&b, "  The copy goes without the labels ReplicaSet %s selects until it has taken over; then it gets them, the ReplicaSet adopts it and drops %s.\n", owner.Name, source.Name)
	}
	writePrediction(&b, prediction)
	b.WriteString("Nothing was changed.\n")
	if c.ReadOnly {
		b.WriteString("--dry-run=client only read the cluster; --dry-run=server also starts the agents (removed again), asks the target's runtime through them whether it restores, and predicts the timings.\n")
	}
	// Preflight reads what the API and the runtimes say; only a real
	// checkpoint and restore prove CRIU, the registry path and the restore.
	fmt.Fprintf(&b, "Preflight does not checkpoint. To prove a checkpoint, push and restore between these nodes without the workload:\n  %s check --from %s --to %s", version.Command(), source.Spec.NodeName, c.TargetNode)
	if c.Transfer != migrate.Direct && c.ImageRepository != "" {
		fmt.Fprintf(&b, " --registry %s", c.ImageRepository)
	}
	b.WriteString("\n")
	_, err := io.WriteString(o.Out, b.String())
	return err
}
