//go:build tools

// Package containerd pins the containerd release the lab's containerd lane
// builds (go run ./test/lab up with LAB_RUNTIME=containerd).
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
)
