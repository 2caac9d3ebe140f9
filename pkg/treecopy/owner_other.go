//go:build !unix

package treecopy

type owner struct{ uid, gid int }

func ownerOf(interface{ Sys() any }) (owner, bool) { return owner{}, false }
