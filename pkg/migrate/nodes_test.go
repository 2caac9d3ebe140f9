package migrate

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// --restore auto takes the kubectl-migrate runtime wherever it is
// installed (no image any pod of the node could run), even where the
// container runtime restores too; a StatefulSet pod's needs it on both
// nodes, as its rollback restores on the source.
func TestAutoRestorePrefersTheRuntimeWhereInstalled(t *testing.T) {
	t.Parallel()
	node := func(name, version string, installed bool) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		n.Status.NodeInfo.ContainerRuntimeVersion = version
		if installed {
			n.Labels[ociruntime.NodeLabel] = "installed"
		}
		return n
	}
	for _, tc := range []struct {
		name   string
		needs  RestoreNeeds
		want   Restore
		noting string
	}{
		{"CRI-O, runtime installed", RestoreNeeds{Target: node("b", "cri-o://1.34.0", true)}, RestoreRuntime, "installed on node b"},
		{"CRI-O, no runtime", RestoreNeeds{Target: node("b", "cri-o://1.34.0", false)}, RestoreCRI, ""},
		{"containerd 2.4, runtime installed", RestoreNeeds{Target: node("b", "containerd://2.4.1", true)}, RestoreRuntime, "does not restore"},
		{"StatefulSet, runtime on the target only", RestoreNeeds{Target: node("b", "cri-o://1.34.0", true), Source: node("a", "cri-o://1.34.0", false)}, RestoreCRI, ""},
		{"StatefulSet, runtime on both", RestoreNeeds{Target: node("b", "cri-o://1.34.0", true), Source: node("a", "cri-o://1.34.0", true)}, RestoreRuntime, "installed on node b"},
		{"asked for the CRI", RestoreNeeds{Want: RestoreCRI, Target: node("b", "cri-o://1.34.0", true)}, RestoreCRI, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			via, note, err := ChooseRestore(tc.needs)
			if err != nil || via != tc.want || !strings.Contains(note, tc.noting) || (tc.noting == "") != (note == "") {
				t.Fatalf("got %q, note %q, %v; want %q noting %q", via, note, err, tc.want, tc.noting)
			}
		})
	}
}
