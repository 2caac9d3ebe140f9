//go:build unix

package treecopy

import "syscall"

type owner struct{ uid, gid int }

// ownerOf is the file's owner, for a copy that keeps it.
func ownerOf(info interface{ Sys() any }) (owner, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}, false
	}
	return owner{int(st.Uid), int(st.Gid)}, true
}
