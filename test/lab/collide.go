package main

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
)

// checkSubnetFree refuses to bring the lab up where its subnet is already
// routed on the host, or where a host the machine needs (the Go module proxy,
// the Debian mirror) resolves into it: routing the subnet into the lab would
// cut that host off.
func checkSubnetFree() error {
	_, subnet, err := net.ParseCIDR(labSubnet)
	if err != nil {
		return err
	}
	routes, _ := output("ip", "-4", "route", "show", "to", "match", labIP)
	for _, line := range strings.Split(routes, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] != "default" && !strings.Contains(line, hostVeth) {
			return fmt.Errorf("the lab's subnet %s is already routed on this machine (%s); the lab needs a free one", labSubnet, line)
		}
	}
	for _, host := range neededHosts() {
		addrs, _ := net.LookupHost(host)
		for _, a := range addrs {
			if ip := net.ParseIP(a); ip != nil && subnet.Contains(ip) {
				return fmt.Errorf("%s resolves to %s, inside the lab's subnet %s; the lab would cut it off", host, a, labSubnet)
			}
		}
	}
	return nil
}

// neededHosts are the package registries this machine reaches.
func neededHosts() []string {
	hosts := []string{"deb.debian.org"}
	if out, err := exec.Command("go", "env", "GOPROXY").Output(); err == nil {
		for _, p := range strings.FieldsFunc(strings.TrimSpace(string(out)), func(r rune) bool { return r == ',' || r == '|' }) {
			if u, err := url.Parse(p); err == nil && u.Hostname() != "" {
				hosts = append(hosts, u.Hostname())
			}
		}
	}
	if mirror := os.Getenv("DEBIAN_MIRROR"); mirror != "" {
		if u, err := url.Parse(mirror); err == nil {
			hosts = append(hosts, u.Hostname())
		}
	}
	return hosts
}
