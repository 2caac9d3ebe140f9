//go:build !unix

package agent

// spaceFor cannot tell here; the agent runs on Linux nodes.
func spaceFor(string, int64) (bool, int64) { return true, -1 }

type owner struct{ uid, gid int }

func ownerOf(interface{ Sys() any }) (owner, bool) { return owner{}, false }
