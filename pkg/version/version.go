// Package version holds the build's version, stamped by the release build
// with -ldflags "-X github.com/kubectl-migrate/kubectl-migrate/pkg/version.Version=…".
package version

import "regexp"

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

// release matches a released build's version (goreleaser's, without the
// tag's v): a snapshot's or a development build's is not one.
var release = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`)

// DocsURL is the address of page under docs/ ("" for the directory) as
// this build's release has it, so that help never points at a later main
// that says otherwise; a development build's is main's.
func DocsURL(page string) string {
	ref := "main"
	if release.MatchString(Version) {
		ref = "v" + Version
	}
	url := "https://github.com/kubectl-migrate/kubectl-migrate/tree/" + ref + "/docs"
	if page != "" {
		url += "/" + page
	}
	return url
}
