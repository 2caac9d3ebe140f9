package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// servicesUp starts the registry and the broker inside the lab namespace.
func (d dirs) servicesUp() error {
	if err := ensurePackages("docker-registry", "rabbitmq-server"); err != nil {
		return err
	}
	regDir := d.state("registry")
	if err := os.MkdirAll(regDir, 0o755); err != nil {
		return err
	}
	cfg := fmt.Sprintf("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s/data\n  delete:\n    enabled: true\nhttp:\n  addr: %s\nlog:\n  level: warn\n", regDir, registry)
	if err := os.WriteFile(regDir+"/config.yml", []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := d.start("registry", inLab("docker-registry", "serve", regDir+"/config.yml"), nil); err != nil {
		return err
	}
	if err := d.privateRegistryUp(); err != nil {
		return err
	}
	rabbitDir := d.state("rabbitmq")
	if err := os.MkdirAll(rabbitDir, 0o755); err != nil {
		return err
	}
	// guest may log in from other hosts only if told so; no plugins.
	if err := os.WriteFile(rabbitDir+"/rabbitmq.conf", []byte("loopback_users = none\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(rabbitDir+"/enabled_plugins", []byte("[].\n"), 0o644); err != nil {
		return err
	}
	if err := run("chown", "-R", "rabbitmq:rabbitmq", rabbitDir); err != nil {
		return err
	}
	// Its own node name and directories, so it never meets a RabbitMQ the
	// machine may run on loopback.
	if err := d.start("rabbitmq", inLab("rabbitmq-server"), []string{
		"RABBITMQ_NODENAME=klab@localhost", "RABBITMQ_NODE_IP_ADDRESS=" + labIP, "RABBITMQ_NODE_PORT=" + amqpPort,
		"RABBITMQ_DIST_PORT=25673", "ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"RABBITMQ_MNESIA_BASE=" + rabbitDir + "/mnesia", "RABBITMQ_LOG_BASE=" + rabbitDir + "/log",
		"RABBITMQ_CONFIG_FILE=" + rabbitDir + "/rabbitmq", "RABBITMQ_ENABLED_PLUGINS_FILE=" + rabbitDir + "/enabled_plugins",
	}); err != nil {
		return err
	}
	for _, addr := range []string{registry, privateRegistry, labIP + ":" + amqpPort} {
		if err := waitFor(addr, 2*time.Minute, func() error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

func ensurePackages(pkgs ...string) error {
	var missing []string
	for _, p := range pkgs {
		if exec.Command("dpkg-query", "-W", "-f=${Status}", p).Run() != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := run("apt-get", "update", "-qq"); err != nil {
		return err
	}
	return run("apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)...)
}

// privateRegistryUp starts the second registry, which asks for credentials
// (htpasswd, bcrypt) on every request.
func (d dirs) privateRegistryUp() error {
	dir := d.state("private-registry")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(privateRegistryUser), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dir+"/htpasswd", []byte(privateRegistryUser+":"+string(hash)+"\n"), 0o644); err != nil {
		return err
	}
	cfg := fmt.Sprintf("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %[1]s/data\n  delete:\n    enabled: true\nhttp:\n  addr: %[2]s\nauth:\n  htpasswd:\n    realm: lab\n    path: %[1]s/htpasswd\nlog:\n  level: warn\n", dir, privateRegistry)
	if err := os.WriteFile(dir+"/config.yml", []byte(cfg), 0o644); err != nil {
		return err
	}
	return d.start("private-registry", inLab("docker-registry", "serve", dir+"/config.yml"), nil)
}
