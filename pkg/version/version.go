// Package version holds the build's version, stamped by the release build
// with -ldflags "-X github.com/kubectl-migrate/kubectl-migrate/pkg/version.Version=…".
package version

// Stamped at build time; the defaults mark a development build.
var (
	Version = "dev"
	Commit  = "none"
	Date    = "unknown"
)

// AgentImage is the published agent image matching this build.
func AgentImage() string {
	tag := Version
	if tag == "dev" {
		tag = "latest"
	}
	return "ghcr.io/kubectl-migrate/kubectl-migrate-agent:" + tag
}
