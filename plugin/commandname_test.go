package plugin

import (
	"strings"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// Under krew the plugin is kubectl-live_migrate: every help text and hint
// must then name "kubectl live-migrate", or a copied command runs nothing
// (or another project's kubectl-migrate).
func TestHelpAndHintsNameThePluginAsItRuns(t *testing.T) {
	version.SetCommandFrom("/home/u/.krew/bin/kubectl-live_migrate")
	defer version.SetCommandFrom("kubectl-migrate")
	w := migratetest.NewWorld(t)
	for _, args := range [][]string{{"--help"}, {"pod", "--help"}, {"sts", "--help"}, {"recover", "--help"}, {"check", "--help"}, {"pod"}} {
		r := execute(t, w, args...)
		text := r.out.String() + r.errOut.String()
		if r.err != nil {
			text += r.err.Error()
		}
		if !strings.Contains(text, "kubectl live-migrate") {
			t.Errorf("%v: never names kubectl live-migrate:\n%s", args, text)
		}
		if strings.Contains(text, "kubectl migrate") {
			t.Errorf("%v: still names kubectl migrate:\n%s", args, text)
		}
	}
}
