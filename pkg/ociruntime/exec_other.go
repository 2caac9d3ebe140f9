//go:build !unix

package ociruntime

import "errors"

// Exec exists off Unix only so the plugin, which shares this package's
// types, builds for every platform it ships on; the runtime runs on Linux
// nodes alone.
func (r Runtime) Exec(args []string) error {
	return errors.New(BinaryName + " runs only on Linux nodes")
}
