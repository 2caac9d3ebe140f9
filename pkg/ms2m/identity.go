package ms2m

import (
	"os"
	"slices"
	"strings"
)

// A checkpoint image can be run by any pod that names it, in any namespace.
// A copy restored into a pod that neither its source nor a migration named
// must never consume: it would take messages from the real owner of its
// queue. The copy learns where it runs from what its new pod gives it (its
// /etc/hostname, the pod's name; the namespace file of its service account
// mount), never from its checkpointed memory (nor from the kernel's
// hostname, which a restore brings back), and compares that with the
// pods its state may run in: the pod it started in and each migration's
// target, which the migration names in PREPARE and STOP.

// namespaceFiles are where a pod finds its namespace: the service account
// mount, or a downward API volume of that path.
var namespaceFiles = []string{
	"/var/run/secrets/kubernetes.io/serviceaccount/namespace",
	"/etc/podinfo/namespace",
}

// PodIdentity returns "NAMESPACE/POD" of the pod this process runs in, read
// afresh: the pod's hostname file (its name) and the first namespace file
// present; "/POD" when the pod has no namespace file, "" when even the
// hostname is unknown.
func PodIdentity() string {
	// The runtime mounts the new pod's /etc/hostname into a restored
	// container, while the kernel's hostname (os.Hostname) comes back from
	// the checkpoint with the rest of the process's namespaces.
	host, err := os.ReadFile("/etc/hostname")
	if err != nil || len(strings.TrimSpace(string(host))) == 0 {
		h, herr := os.Hostname()
		host, err = []byte(h), herr
	}
	name, _, _ := strings.Cut(strings.TrimSpace(string(host)), ".") // setHostnameAsFQDN
	if err != nil || name == "" {
		return ""
	}
	for _, f := range namespaceFiles {
		if ns, err := os.ReadFile(f); err == nil && len(strings.TrimSpace(string(ns))) > 0 {
			return strings.TrimSpace(string(ns)) + "/" + name
		}
	}
	return "/" + name
}

// maxHomes bounds State.Homes: the pod it started in and the last targets.
const maxHomes = 8

// mayRunIn reports whether a copy in pod identity where may consume: where
// is unknown, or names one of homes (a side that knows no namespace
// compares names only).
func mayRunIn(homes []string, where string) bool {
	if where == "" || len(homes) == 0 {
		return true
	}
	ns, name, _ := strings.Cut(where, "/")
	return slices.ContainsFunc(homes, func(h string) bool {
		hns, hname, _ := strings.Cut(h, "/")
		return hname == name && (hns == ns || hns == "" || ns == "")
	})
}

// addHomeLocked lets the state run in target (a migration's target pod).
func (c *Consumer) addHomeLocked(target string) {
	if target == "" || slices.Contains(c.st.Homes, target) {
		return
	}
	// A new slice each time: snapshots from State share the old one.
	homes := append(slices.Clone(c.st.Homes), target)
	if n := len(homes); n > maxHomes {
		// Keep the pod it started in, and the latest targets.
		homes = slices.Concat(homes[:1], homes[n-maxHomes+1:])
	}
	c.st.Homes = homes
}
