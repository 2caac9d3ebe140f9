// Command kubectl-migrate-runtime is the OCI runtime of the kubectl-migrate
// RuntimeClass (pkg/ociruntime): the node's containerd or CRI-O calls it as
// it calls runc, and it hands every command to runc but the create of a
// container a migration staged a checkpoint for, which it restores.
//
// node-setup installs it from the agent image, whose one static binary
// becomes this command when it is run under this name; this main builds the
// runtime alone.
package main

import (
	"os"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

func main() { os.Exit(ociruntime.Main(os.Args[1:])) }
