// Command kubectl-migrate-agent runs on a node in a pod that the agents'
// controller ("controller", installed by node-setup) creates for a
// migration. "serve" is the warm agent a migration starts at its beginning:
// it packs and removes archives over HTTP as they are asked for. "pack"
// turns a kubelet checkpoint archive into an OCI checkpoint image, pushes it
// and deletes the archive; "remove" deletes archives; their result goes to
// the pod's termination message.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/nodesetup"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

const usage = `usage:
  kubectl-migrate-agent serve [--idle 15m] [--direct DIR [--stage DIR]] (HTTP on port 8090, or 8091 with --direct: pack and remove as asked)
  kubectl-migrate-agent pack --archive PATH --container NAME --image REF [--insecure] [--keep-archive]
  kubectl-migrate-agent remove PATH...
  kubectl-migrate-agent install DIR   (copy this static binary into DIR)
  kubectl-migrate-agent node-setup --runtime containerd|cri-o [--uninstall] [--restart auto|systemd|signal]
  kubectl-migrate-agent controller --image REF [--namespace NS] (the agents' controller: builds the agent pods migrations request)
  kubectl-migrate-agent noop          (exit 0: run from another image to pull it)
  kubectl-migrate-agent fill-volumes SNAPSHOT MOUNTS (a target pod's init container: copy each SNAPSHOT/NAME into MOUNTS/NAME)
  kubectl-migrate-agent canary        (kubectl migrate check's stand-in workload: state on port 8092)`

func main() {
	// node-setup installs this binary as the runtime of the
	// kubectl-migrate RuntimeClass: the shim calls it as it calls runc.
	if filepath.Base(os.Args[0]) == ociruntime.BinaryName {
		os.Exit(ociruntime.Main(os.Args[1:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	msg, err := run(ctx, os.Args[1:])
	if err != nil {
		msg = "error: " + err.Error()
	}
	// The kubelet reads this file into the pod status: the plugin's channel.
	_ = os.WriteFile("/dev/termination-log", []byte(msg), 0o644)
	fmt.Println(msg)
	if err != nil {
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) (string, error) {
	if len(args) == 0 {
		return "", fmt.Errorf("no command\n%s", usage)
	}
	switch args[0] {
	case "pack":
		var req agent.PackRequest
		fs := flag.NewFlagSet("pack", flag.ContinueOnError)
		fs.StringVar(&req.Archive, "archive", "", "checkpoint archive under "+agent.CheckpointDir)
		fs.StringVar(&req.Container, "container", "", "name of the checkpointed container")
		fs.StringVar(&req.Image, "image", "", "image reference to push to")
		fs.BoolVar(&req.Insecure, "insecure", false, "allow a plain-HTTP registry")
		fs.BoolVar(&req.KeepArchive, "keep-archive", false, "keep the archive after pushing")
		if err := fs.Parse(args[1:]); err != nil {
			return "", err
		}
		if req.Archive == "" || req.Container == "" || req.Image == "" {
			return "", fmt.Errorf("pack needs --archive, --container and --image\n%s", usage)
		}
		res, err := agent.PackInScope(ctx, req, image.Registry{Insecure: req.Insecure}, agent.ScopeFromEnv())
		if err != nil {
			return "", err
		}
		out, err := json.Marshal(res)
		return string(out), err
	case "canary":
		return "", agent.RunCanary(ctx, agent.CanaryPort)
	case "install":
		if len(args) != 2 {
			return "", fmt.Errorf("install needs a directory\n%s", usage)
		}
		return agent.InstallSelf(args[1])
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		idle := fs.Duration("idle", 15*time.Minute, "end after this long without a request")
		direct := fs.String("direct", "", "also receive checkpoints (over TLS, on the node's network, port 8093) and serve them to this node (port 8091) from this directory; the push token in $"+agent.TokenEnv)
		stage := fs.String("stage", "", "with --direct, extract checkpoints sent for staging into this directory (the node's "+ociruntime.StageDir+"), where the kubectl-migrate runtime restores them")
		if err := fs.Parse(args[1:]); err != nil {
			return "", err
		}
		port := agent.ServePort
		var d *agent.Direct
		if *direct != "" {
			token := agent.Token(agent.TokenEnv)
			if token == "" {
				return "", fmt.Errorf("--direct needs the push token in $%s", agent.TokenEnv)
			}
			receive, err := net.Listen("tcp", fmt.Sprintf(":%d", agent.DirectReceivePort))
			if err != nil {
				return "", err
			}
			if d, err = agent.NewDirect(*direct, token, receive); err != nil {
				return "", err
			}
			d.StageDir = *stage
			d.Scope = agent.ScopeFromEnv()
			port = agent.DirectPort
		}
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			return "", err
		}
		return "served", agent.Serve(ctx, ln, *idle, d, agent.Token(agent.ControlTokenEnv), agent.ScopeFromEnv())
	case "node-setup":
		fs := flag.NewFlagSet("node-setup", flag.ContinueOnError)
		o := nodesetup.Options{}
		fs.StringVar(&o.Runtime, "runtime", "", "the node's container runtime: containerd or cri-o")
		fs.BoolVar(&o.Uninstall, "uninstall", false, "remove what node-setup installed")
		fs.StringVar(&o.Restart, "restart", nodesetup.RestartAuto, "how to restart the runtime: auto, systemd or signal")
		if err := fs.Parse(args[1:]); err != nil {
			return "", err
		}
		o.Socket = nodesetup.SocketUnder(nodesetup.HostRun, o.Runtime)
		o.Handlers = func(ctx context.Context) ([]string, error) { return agent.RuntimeHandlers(ctx, o.Socket) }
		self, err := os.Executable()
		if err != nil {
			return "", err
		}
		o.Self = self
		return nodesetup.Run(ctx, o)
	case "controller":
		fs := flag.NewFlagSet("controller", flag.ContinueOnError)
		namespace := fs.String("namespace", agent.DefaultNamespace, "the agents' namespace, where requests are made and agents run")
		img := fs.String("image", "", "the agents' image (this one's)")
		if err := fs.Parse(args[1:]); err != nil {
			return "", err
		}
		if *img == "" {
			return "", fmt.Errorf("controller needs --image\n%s", usage)
		}
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return "", err
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return "", err
		}
		self, err := os.Hostname() // the pod's name
		if err != nil {
			return "", err
		}
		c := agent.Controller{Client: client, Namespace: *namespace, Image: *img, Identity: self,
			PolicySince: func(ctx context.Context) (time.Time, error) { return agent.PolicySince(ctx, client) }}
		return "stopped", c.Run(ctx)
	case "noop":
		return "ok", nil
	case "fill-volumes":
		if len(args) != 3 {
			return "", fmt.Errorf("fill-volumes needs the snapshot's directory and the mounts' directory\n%s", usage)
		}
		return agent.FillVolumes(args[1], args[2])
	case "remove":
		for _, p := range args[1:] {
			if err := agent.RemoveInScope(p, agent.ScopeFromEnv()); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("removed %d archive(s)", len(args)-1), nil
	}
	return "", fmt.Errorf("unknown command %q\n%s", args[0], usage)
}
