package agent

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// TestFenceNetns puts the fence into a network namespace of the test's
// own, twice, and lifts it, twice: one fence, then none, whatever was
// there before. It needs root (CI runs as root); the lab shows the fence
// stopping a pod's traffic.
func TestFenceNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to make a network namespace")
	}
	path := make(chan string)
	done := make(chan struct{})
	defer close(done)
	go func() {
		// The thread stays in the new namespace until the goroutine ends
		// still locked to it, and so does the thread.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			path <- "unshare: " + err.Error()
			return
		}
		path <- "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
		<-done
	}()
	ns := <-path
	if !strings.HasPrefix(ns, "/proc/") {
		t.Skip(ns)
	}
	// The thread's namespace file is this process's to open only through
	// its own /proc/self; an open file pins it for the calls below.
	ns = strings.Replace(ns, "/proc/self/", "/proc/"+strconv.Itoa(os.Getpid())+"/", 1)
	fenced := func() bool {
		t.Helper()
		on, err := Fenced(ns)
		if err != nil {
			t.Fatal(err)
		}
		return on
	}
	if fenced() {
		t.Fatal("a new namespace is fenced")
	}
	for range 2 {
		if err := fenceNetns(ns, false); err != nil {
			t.Fatal(err)
		}
		if !fenced() {
			t.Fatal("no fence after fencing")
		}
		if chains, rules := chainsOf(t, ns); chains != 2 || rules != 2 {
			t.Fatalf("the fence has %d chains and %d rules, not an input and an output chain letting loopback through", chains, rules)
		}
	}
	for range 2 {
		if err := fenceNetns(ns, true); err != nil {
			t.Fatal(err)
		}
		if fenced() {
			t.Fatal("still fenced after lifting")
		}
	}
}

// chainsOf counts the fence's chains in the namespace at path, and their
// rules.
func chainsOf(t *testing.T, path string) (chains, rules int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range all {
		if ch.Table.Name != fenceTable {
			continue
		}
		if *ch.Policy != nftables.ChainPolicyDrop {
			t.Errorf("chain %s lets through what loopback does not carry", ch.Name)
		}
		rs, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		chains, rules = chains+1, rules+len(rs)
	}
	return chains, rules
}
