//go:build !unix

package agent

// spaceFor cannot tell here; the agent runs on Linux nodes.
func spaceFor(string, int64) (bool, int64) { return true, -1 }
