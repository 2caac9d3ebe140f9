package migrate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strings"
	"testing"
)

// TestRunnerNamesNoPhase: what the runner does around a phase comes from the
// phase's traits, never from its name, so adding a phase touches its own
// file and the phase lists only.
func TestRunnerNamesNoPhase(t *testing.T) {
	t.Parallel()
	file, err := parser.ParseFile(token.NewFileSet(), "runner.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(file, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "report" {
			switch sel.Sel.Name {
			case "Preflight", "Prepare", "Stop", "Checkpoint", "Image", "Restore", "Replay", "Switchover", "Detach", "Adopt", "Cleanup":
				t.Errorf("runner.go names the phase report.%s; give the phase a trait instead", sel.Sel.Name)
			}
		}
		return true
	})
}

// TestPhaseTraits: the traits the runner relies on are where they belong,
// also through a shadow stage's wrapper.
func TestPhaseTraits(t *testing.T) {
	t.Parallel()
	if !traitsOf(preflight{}).unjournaled || traitsOf(checkpoint{}).unjournaled {
		t.Error("only preflight goes unjournaled")
	}
	m := &Migration{config: Config{ReplayTimeout: 7, PhaseTimeout: 3}}
	if tr := traitsOf(inStage{Phase: replay{}, stage: "final", onFinal: true}); tr.timeout == nil || tr.timeout(m) != 7 {
		t.Error("replay in a stage lost its own timeout")
	}
	if !traitsOf(inStage{Phase: switchover{}, stage: "final"}).endsTotal || traitsOf(inStage{Phase: handover{}, stage: "shadow"}).endsTotal {
		t.Error("only the switchover that completes a migration ends its total time")
	}
}

// TestMigrationHasFewNames: the phases reach a migration's configuration,
// outside systems and state through a handful of named fields, not through
// dozens of promoted names with case-only twins.
func TestMigrationHasFewNames(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[Migration]()
	if typ.NumField() > 20 {
		t.Errorf("Migration has %d fields", typ.NumField())
	}
	lower := map[string]string{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Anonymous {
			t.Errorf("Migration embeds %s: its names would be promoted onto every phase's receiver", f.Name)
		}
		if other, ok := lower[strings.ToLower(f.Name)]; ok {
			t.Errorf("Migration's %s and %s differ only in case", other, f.Name)
		}
		lower[strings.ToLower(f.Name)] = f.Name
	}
}
