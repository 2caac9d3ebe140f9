package agent

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestSandboxNetns: the fence goes into the network namespace the runtime
// pinned for the pod, as CRI-O and containerd report it, and nowhere else a
// status could name.
func TestSandboxNetns(t *testing.T) {
	spec := func(namespaces string) map[string]string {
		return map[string]string{"info": `{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},` + namespaces + `]}}}`}
	}
	for _, tc := range []struct {
		name string
		info map[string]string
		want string // "" for refused
	}{
		{"CRI-O", spec(`{"type":"network","path":"/var/run/netns/3f87aa7d-c3db"}`), "/run/netns/3f87aa7d-c3db"},
		{"containerd", spec(`{"type":"network","path":"/var/run/netns/cni-1258de20"}`), "/run/netns/cni-1258de20"},
		{"pinned under /run", spec(`{"type":"network","path":"/run/netns/x"}`), "/run/netns/x"},
		{"host network", spec(`{"type":"network"}`), ""},
		{"no network namespace", spec(`{"type":"ipc","path":"/var/run/ipcns/x"}`), ""},
		{"another process's", spec(`{"type":"network","path":"/proc/1/ns/net"}`), ""},
		{"out of the pins", spec(`{"type":"network","path":"/var/run/netns/../../etc/passwd"}`), ""},
		{"deeper", spec(`{"type":"network","path":"/run/netns/a/b"}`), ""},
		{"no verbose status", map[string]string{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sandboxNetns(tc.info)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("accepted %s", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}

// TestFencingAgent: only a serving agent that reaches the runtime may
// fence, and only it gets the pinned network namespaces and the
// capabilities to enter them and set their firewall.
func TestFencingAgent(t *testing.T) {
	for _, bad := range []AgentRequest{
		{Node: "node-a", Image: "agent:1", Command: commandServe, Fence: true},
		{Node: "node-a", Image: "agent:1", Command: commandPack, Fence: true, RuntimeSocket: "/run/crio/crio.sock"},
	} {
		if bad.Validate("agent:1") == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	grants := func(fence bool) (caps []corev1.Capability, netns bool) {
		req := AgentRequest{Node: "node-a", Image: "agent:1", Command: commandServe, RuntimeSocket: "/run/crio/crio.sock", Fence: fence}
		if err := req.Validate("agent:1"); err != nil {
			t.Fatal(err)
		}
		s, err := RequestSecret("agent-f", "agents", "shop", nil, req, "control", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		pod := RequestedPod(s, req, "shop")
		c := pod.Spec.Containers[0]
		if c.SecurityContext.Capabilities != nil {
			caps = c.SecurityContext.Capabilities.Add
		}
		for _, m := range c.VolumeMounts {
			if m.MountPath == NetnsDir {
				netns = m.ReadOnly && *m.MountPropagation == corev1.MountPropagationHostToContainer
			}
		}
		return caps, netns
	}
	if caps, netns := grants(true); !netns || !slices.Equal(caps, []corev1.Capability{"NET_ADMIN", "SYS_ADMIN"}) {
		t.Errorf("a fencing agent gets %v, netns %v", caps, netns)
	}
	if caps, netns := grants(false); netns || len(caps) > 0 {
		t.Errorf("an agent that does not fence gets %v, netns %v", caps, netns)
	}
}
