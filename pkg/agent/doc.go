// Package agent is the node-side half of a migration. The kubelet writes a
// checkpoint archive that only root on the source node can read, so the
// plugin runs a short-lived pod there (Launcher) whose container runs the
// kubectl-migrate-agent binary (Pack): it packs the archive as an OCI
// checkpoint image, pushes it, deletes the archive and reports the result in
// its termination message.
package agent
