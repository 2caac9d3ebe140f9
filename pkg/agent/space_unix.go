//go:build unix

package agent

import "syscall"

// spaceFor reports whether size more bytes fit in the filesystem of dir
// while leaving it a reserve (5 %, at least 1 GiB): an archive must not
// fill the node's disk, which its kubelet and every other pod share.
func spaceFor(dir string, size int64) (ok bool, free int64) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return true, -1 // the write itself will tell
	}
	free = int64(st.Bavail) * int64(st.Bsize)
	reserve := max(int64(st.Blocks)*int64(st.Bsize)/20, 1<<30)
	return size <= free-reserve, free
}
