// Command lab runs a real two-node Kubernetes cluster on this machine, with
// CRI-O (or containerd, with LAB_RUNTIME=containerd), runc and CRIU on each node, a registry and a RabbitMQ, all inside
// network namespaces it creates, so kubectl-migrate can be proven on real
// kubelets, a real runtime and real checkpoints.
//
//	go run ./test/lab up      build what is missing (cached), start everything
//	go run ./test/lab down    end every process it started, remove mounts,
//	                          namespaces, links and cgroups
//	go run ./test/lab status  what runs, and the kubeconfig path
//	go run ./test/lab env     shell exports for the e2e tests
//	go run ./test/lab stop|start DAEMON  stop or start again the registry, rabbitmq, kube-apiserver or a kubelet (fault tests)
//	go run ./test/lab images  rebuild and push the lab's images; the running nodes drop their copies
//	go run ./test/lab demo    up, then migrate the sample workload and report
//	go run ./test/lab build   only build what is missing
//	go run ./test/lab restore NODE on|off  containerd lane: turn a node's restore opt-in on or off
//
// It must run as root, from the repository's root.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

func main() {
	if len(os.Args) < 2 || len(os.Args) > 4 || (len(os.Args) > 2) != (os.Args[1] == "stop" || os.Args[1] == "start" || os.Args[1] == "restore" || os.Args[1] == "python-image") {
		fmt.Fprintln(os.Stderr, "usage: go run ./test/lab up|down|status|env|images|demo|build, stop|start DAEMON ("+strings.Join(restartable, ", ")+"), restore NODE on|off, or python-image IMAGE-REF")
		os.Exit(2)
	}
	d := labDirs()
	var err error
	switch os.Args[1] {
	case "up":
		err = d.up()
	case "down":
		err = d.down()
	case "status":
		err = d.status()
	case "env":
		err = d.printEnv()
	case "restore":
		if len(os.Args) != 4 {
			err = errors.New("usage: go run ./test/lab restore NODE on|off")
		} else {
			err = d.setRestore(os.Args[2], os.Args[3])
		}
	case "build":
		// A lane's builds only add to the cache: they may run while
		// another lane is up (make test builds the containerd lanes
		// beside the CRI-O e2e).
		t0 := time.Now()
		var rt nodeRuntime
		if rt, err = runtimeNamed(os.Getenv("LAB_RUNTIME")); err == nil {
			err = d.ensureBuilds(".", rt, logf)
		}
		if err == nil {
			logf("builds ready after %s", time.Since(t0).Round(time.Second))
		}
	case "demo":
		err = d.demo()
	case "stop", "start":
		if len(os.Args) != 3 {
			err = fmt.Errorf("usage: go run ./test/lab %s DAEMON", os.Args[1])
		} else if os.Args[1] == "stop" {
			err = d.stopDaemon(os.Args[2])
		} else {
			err = d.startDaemon(os.Args[2])
		}
	case "images":
		if err = d.pushImages(context.Background(), "."); err == nil {
			err = d.evictImages(context.Background())
		}
	case "python-image":
		if len(os.Args) != 3 {
			err = errors.New("usage: go run ./test/lab python-image IMAGE-REF (pushed with your docker credentials)")
		} else {
			err = d.publishPython(context.Background(), os.Args[2])
		}
	default:
		err = fmt.Errorf("unknown command %q; use up, down, status, env, images, python-image, demo or build", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "lab: "+format+"\n", args...)
}

func (d dirs) up() error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (namespaces, mounts, cgroups)")
	}
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat("test/lab/k8s/go.mod"); err != nil {
		return errors.New("run it from the repository's root: go run ./test/lab up")
	}
	rt, err := d.runtime()
	if err != nil {
		return err
	}
	if d.healthy() == nil {
		logf("already up with %s; kubeconfig %s", rt.name, d.kubeconfig())
		return nil
	}
	if err := d.down(); err != nil { // clear whatever a half-finished run left
		return err
	}
	t0 := time.Now()
	if err := checkSubnetFree(); err != nil {
		return err
	}
	if err := d.ensureBuilds(repo, rt, logf); err != nil {
		return err
	}
	built := time.Now()
	for _, sub := range []string{"logs", "pids", "pki"} {
		if err := os.MkdirAll(d.state(sub), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(d.state("runtime"), []byte(rt.name+"\n"), 0o644); err != nil {
		return err
	}
	steps := []struct {
		name string
		fn   func() error
	}{
		{"network", networkUp},
		{"pipe size", d.raisePipeMaxSize},
		{"pki", func() error { return generatePKI(d) }},
		{"registry and broker", d.servicesUp},
		{"images", func() error { return d.pushImages(context.Background(), repo) }},
		{"control plane", d.controlPlaneUp},
		{"nodes", func() error {
			for _, n := range nodes {
				if err := d.nodeUp(n); err != nil {
					return err
				}
			}
			return d.waitNodesReady(3 * time.Minute)
		}},
	}
	for _, s := range steps {
		ts := time.Now()
		if err := s.fn(); err != nil {
			return fmt.Errorf("%s: %w (logs in %s)", s.name, err, d.state("logs"))
		}
		logf("%s ready after %s", s.name, time.Since(ts).Round(100*time.Millisecond))
	}
	logf("up with %s in %s (builds %s, start %s); kubeconfig %s", rt.name, time.Since(t0).Round(time.Second),
		built.Sub(t0).Round(time.Second), time.Since(built).Round(time.Second), d.kubeconfig())
	return nil
}

func (d dirs) down() error {
	// Nodes first (their kubelets would otherwise report to a dying
	// apiserver), then the control plane and services, etcd last; each group
	// stops in parallel.
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	collect := func(e ...error) { mu.Lock(); errs = append(errs, e...); mu.Unlock() }
	for _, n := range nodes {
		wg.Go(func() { collect(d.nodeDown(n)...) })
	}
	wg.Wait()
	for _, p := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "registry", "private-registry", "rabbitmq"} {
		wg.Go(func() { collect(d.stop(p, 20*time.Second)) })
	}
	wg.Wait()
	collect(d.stop("etcd", 20*time.Second)) // last: the apiserver needs it to shut down
	// Whatever else runs in the lab's namespaces (epmd, helpers of the
	// broker) was started by the lab too.
	for _, ns := range append([]string{labNetns}, netnsNames()...) {
		if !netnsExists(ns) {
			continue
		}
		pids, _ := output("ip", "netns", "pids", ns)
		for _, f := range strings.Fields(pids) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil {
				_ = killPID(pid, 5*time.Second)
			}
		}
	}
	if err := networkDown(); err != nil {
		errs = append(errs, err)
	}
	if err := d.restorePipeMaxSize(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.run); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func netnsNames() []string {
	var names []string
	for _, n := range nodes {
		names = append(names, n.netns())
	}
	return names
}
