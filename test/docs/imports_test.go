package docs

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoArrowBackUp: the packages import downwards only. The plugin is the
// top: only it imports cobra; the engine's packages never import the
// plugin; presentation (pkg/report/render) draws data and imports none of
// the packages that produce it, which hand it what to draw; node-setup's
// cluster half is beside its node half, under the agent.
func TestNoArrowBackUp(t *testing.T) {
	const module = "github.com/kubectl-migrate/kubectl-migrate/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "../../...").Output()
	if err != nil {
		t.Fatal(err)
	}
	forbidden := map[string][]string{
		"pkg/report/render": {"pkg/migrate", "pkg/check", "pkg/conformance", "pkg/drain", "pkg/agent", "plugin"},
		"pkg/":              {"plugin", "github.com/spf13/cobra"},
		// node-setup's two halves sit below the agent that runs the node
		// half and the engine; the Kubernetes helpers below everything.
		"pkg/nodesetup": {"pkg/agent", "pkg/migrate", "pkg/drain", "pkg/check"},
		"pkg/kube":      {"pkg/agent", "pkg/migrate", "pkg/drain", "pkg/check", "pkg/nodesetup"},
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		for prefix, banned := range forbidden {
			if !strings.HasPrefix(pkg, prefix) {
				continue
			}
			for _, imp := range fields[1:] {
				rel := strings.TrimPrefix(imp, module)
				for _, b := range banned {
					if rel == b || strings.HasPrefix(rel, b+"/") {
						t.Errorf("%s imports %s: an arrow back up", pkg, imp)
					}
				}
			}
		}
	}
}
