//go:build !unix

package nodesetup

import (
	"context"
	"errors"
)

// signalRuntime: node-setup runs on Linux nodes only.
func (o Options) signalRuntime(context.Context) error {
	return errors.New("node-setup signals runtimes on Linux nodes only")
}
