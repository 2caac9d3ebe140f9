package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// artifact is one cached build: made once, reused until its pin changes.
type artifact struct {
	name    string
	stamp   string // names the pin; a new pin rebuilds
	build   func(d dirs, repo string) error
	runtime string // built only for this runtime's lane ("" for every lane)
}

func goBuild(dir string, env []string, args ...string) error {
	cmd := exec.Command("go", append([]string{"build", "-trimpath"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(cmd.Environ(), append([]string{"CGO_ENABLED=0"}, env...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func script(repo, name string, args ...string) error {
	cmd := exec.Command("bash", append([]string{filepath.Join(repo, "test/lab/scripts", name)}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v\n%s", name, err, out)
	}
	return nil
}

var artifacts = []artifact{
	{"kubernetes", "kubernetes-" + kubernetesVersion, func(d dirs, repo string) error {
		var ld []string
		for _, p := range []string{"k8s.io/client-go/pkg/version", "k8s.io/component-base/version"} {
			ld = append(ld, "-X", p+".gitVersion=v"+kubernetesVersion, "-X", p+".gitMajor=1", "-X", p+".gitMinor=34", "-X", p+".gitTreeState=clean")
		}
		return goBuild(filepath.Join(repo, "test/lab/k8s"), nil, "-ldflags", "-s -w "+strings.Join(ld, " "), "-o", filepath.Join(d.cache, "bin")+"/",
			"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager",
			"k8s.io/kubernetes/cmd/kube-scheduler", "k8s.io/kubernetes/cmd/kubelet")
	}, ""},
	{"kubectl", "kubectl-" + kubernetesVersion, func(d dirs, repo string) error {
		return goBuild(filepath.Join(repo, "test/kubectl"), nil, "-o", d.bin("kubectl"), ".")
	}, ""},
	{"etcd", "etcd-" + etcdVersion, func(d dirs, repo string) error {
		return goBuild(filepath.Join(repo, "test/lab/etcd"), nil, "-o", d.bin("etcd"), "go.etcd.io/etcd/server/v3")
	}, ""},
	{"rootfs", "rootfs-trixie-criu-sid", func(d dirs, repo string) error {
		_ = os.RemoveAll(d.rootfs())
		return script(repo, "rootfs.sh", d.rootfs())
	}, ""},
	{"cri-o", "crio-" + crioVersion, func(d dirs, repo string) error {
		return script(repo, "crio.sh", d.rootfs(), d.cache, crioVersion, filepath.Join(d.cache, "bin"))
	}, "crio"},
	{"containerd", "containerd-" + containerdVersion, func(d dirs, repo string) error {
		return goBuild(filepath.Join(repo, "test/lab/containerd"), nil,
			"-ldflags", "-s -w -X github.com/containerd/containerd/v2/version.Version="+containerdVersion,
			"-o", filepath.Join(d.cache, "bin")+"/",
			"github.com/containerd/containerd/v2/cmd/containerd", "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2")
	}, "containerd"},
	{"containerd 2.4", "containerd-" + containerd24Version, func(d dirs, repo string) error {
		return goBuild(filepath.Join(repo, "test/lab/containerd24"), nil,
			"-ldflags", "-s -w -X github.com/containerd/containerd/v2/version.Version="+containerd24Version,
			"-o", filepath.Join(d.cache, "bin", "containerd-"+containerd24Version)+"/",
			"github.com/containerd/containerd/v2/cmd/containerd", "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2")
	}, "containerd-2.4"},
	{"python", "python-trixie-pika-redis", func(d dirs, repo string) error {
		return script(repo, "python-rootfs.sh", d.pythonBase())
	}, ""},
	{"runc-wrapper", "runc-wrapper-1", func(d dirs, repo string) error {
		return goBuild(repo, nil, "-o", d.bin("runc-wrapper"), "./test/lab/runc-wrapper")
	}, ""},
}

// ensureBuilds builds what runtime lane rt is missing, in order (CRI-O
// builds in the rootfs).
func (d dirs) ensureBuilds(repo string, rt nodeRuntime, logf func(string, ...any)) error {
	if err := os.MkdirAll(filepath.Join(d.cache, "bin"), 0o755); err != nil {
		return err
	}
	for _, a := range artifacts {
		if a.runtime != "" && a.runtime != rt.name {
			continue
		}
		stamp := filepath.Join(d.cache, "stamps", a.stamp)
		if _, err := os.Stat(stamp); err == nil {
			continue
		}
		logf("building %s (cached in %s from now on)", a.name, d.cache)
		t0 := time.Now()
		if err := a.build(d, repo); err != nil {
			return fmt.Errorf("build %s: %w", a.name, err)
		}
		if err := os.MkdirAll(filepath.Dir(stamp), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(stamp, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
			return err
		}
		logf("built %s in %s", a.name, time.Since(t0).Round(time.Second))
	}
	return nil
}
