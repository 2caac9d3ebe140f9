//go:build tools

// Package containerd24 pins the containerd release of the lab's containerd-2.4 lane
// (go run ./test/lab up with LAB_RUNTIME=containerd-2.4): the release without CRI restore.
package containerd24

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
)
