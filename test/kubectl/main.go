// Command kubectl is the upstream kubectl, built from the module proxy so the
// tests can drive kubectl-migrate through kubectl's real plugin mechanism on
// machines that have no kubectl.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
)

func main() {
	os.Exit(cli.Run(cmd.NewDefaultKubectlCommand()))
}
