// Package integration drives the built kubectl-migrate binary through real
// programs: kubectl's own plugin mechanism here; the lab cluster's e2e lives
// in test/e2e.
package integration
