// Package image builds and moves the OCI images of a migration with
// go-containerregistry: checkpoint images (a checkpoint archive as one layer,
// annotated so CRI-O and containerd restore from it) and the small images of
// static binaries that the lab and the release run (agent, producer,
// consumer). No Docker daemon is involved.
package image
