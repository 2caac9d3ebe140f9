package main

import (
	"fmt"
	"os"
	"strings"
)

// The lab's network: a namespace "klab" holding a bridge with the control
// plane, registry and broker on labIP; one namespace per node joined to the
// bridge by a veth; one veth from the host into the bridge, so the host
// reaches labIP without anything in the host's namespace listening on a
// non-loopback address.
const hostVeth = "klab-host"

func netnsExists(name string) bool {
	_, err := os.Stat("/run/netns/" + name)
	return err == nil
}

func networkUp() error {
	if netnsExists(labNetns) {
		return nil // the whole network is set up at once, so one check is enough
	}
	steps := [][]string{
		{"ip", "netns", "add", labNetns},
		{"ip", "-n", labNetns, "link", "set", "lo", "up"},
		{"ip", "-n", labNetns, "link", "add", bridgeName, "type", "bridge"},
		{"ip", "-n", labNetns, "addr", "add", labIP + "/" + prefixLen, "dev", bridgeName},
		{"ip", "-n", labNetns, "link", "set", bridgeName, "up"},
		{"ip", "netns", "exec", labNetns, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "link", "add", hostVeth, "type", "veth", "peer", "name", "klab-host-br", "netns", labNetns},
		{"ip", "-n", labNetns, "link", "set", "klab-host-br", "master", bridgeName, "up"},
		{"ip", "addr", "add", hostIP + "/" + prefixLen, "dev", hostVeth},
		{"ip", "link", "set", hostVeth, "up"},
	}
	for _, n := range nodes {
		ns, peer := n.netns(), "veth-"+n.Name
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", labNetns, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", labNetns, "link", "set", peer, "master", bridgeName, "up"},
			[]string{"ip", "-n", ns, "addr", "add", n.IP + "/" + prefixLen, "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "route", "add", "default", "via", labIP},
			[]string{"ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
			// The control plane reaches pods (the pod proxy) through their node.
			[]string{"ip", "-n", labNetns, "route", "add", n.PodCIDR, "via", n.IP},
		)
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	return nil
}

func networkDown() error {
	var errs []string
	for _, n := range nodes {
		if netnsExists(n.netns()) {
			if err := run("ip", "netns", "del", n.netns()); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if netnsExists(labNetns) {
		if err := run("ip", "netns", "del", labNetns); err != nil {
			errs = append(errs, err.Error())
		}
	}
	// Deleting the namespace deletes the peer, and with it the host's end;
	// delete it explicitly in case the namespace was already gone.
	_ = run("ip", "link", "del", hostVeth)
	if len(errs) > 0 {
		return fmt.Errorf("network: %s", strings.Join(errs, "; "))
	}
	return nil
}
