package version

import "testing"

func TestDocsURLFollowsTheRelease(t *testing.T) {
	defer func(was string) { Version = was }(Version)
	for _, tc := range []struct{ version, page, want string }{
		{"1.4.2", "check.md", "https://github.com/kubectl-migrate/kubectl-migrate/tree/v1.4.2/docs/check.md"},
		{"dev", "check.md", "https://github.com/kubectl-migrate/kubectl-migrate/tree/main/docs/check.md"},
		{"1.5.0-SNAPSHOT-abc123", "", "https://github.com/kubectl-migrate/kubectl-migrate/tree/main/docs"},
	} {
		Version = tc.version
		if got := DocsURL(tc.page); got != tc.want {
			t.Errorf("version %s: DocsURL(%q) = %s, want %s", tc.version, tc.page, got, tc.want)
		}
	}
}

func TestCommandForFollowsKubectlsNaming(t *testing.T) {
	for exe, want := range map[string]string{
		"/usr/local/bin/kubectl-migrate":         "kubectl migrate",
		"/home/u/.krew/bin/kubectl-live_migrate": "kubectl live-migrate",
		`C:\krew\bin\kubectl-live_migrate.exe`:   "kubectl live-migrate",
		"kubectl-foo-bar":                        "kubectl foo bar",
		"/tmp/go-build1/b001/plugin.test":        DefaultCommand,
		"kubectl-":                               DefaultCommand,
	} {
		if got := CommandFor(exe); got != want {
			t.Errorf("CommandFor(%q) = %q, want %q", exe, got, want)
		}
	}
}
