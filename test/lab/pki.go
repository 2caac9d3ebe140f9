package main

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// A throwaway PKI for one lab: generated at up, deleted at down.
type pki struct {
	d      dirs
	caCert *x509.Certificate
	caKey  *rsa.PrivateKey
}

type certSpec struct {
	name   string
	cn     string
	org    []string
	server bool
	ips    []string
	dns    []string
}

func newPKI(d dirs) (*pki, error) {
	if err := os.MkdirAll(filepath.Dir(d.pki("x")), 0o700); err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubectl-migrate-lab-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(30 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{d: d, caCert: ca, caKey: key}
	return p, p.write("ca", der, key)
}

func (p *pki) write(name string, der []byte, key *rsa.PrivateKey) error {
	if err := os.WriteFile(p.d.pki(name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(p.d.pki(name+".key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
}

func (p *pki) issue(s certSpec) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: s.cn, Organization: s.org},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(30 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, DNSNames: s.dns,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if s.server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	for _, ip := range s.ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	return p.write(s.name, der, key)
}

// kubeconfig writes a kubeconfig for the client certificate name.
func (p *pki) kubeconfig(path, name string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: "https://" + labIP + ":" + apiPort, CertificateAuthority: p.d.pki("ca.crt")}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificate: p.d.pki(name + ".crt"), ClientKey: p.d.pki(name + ".key")}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: name, Namespace: "default"}
	cfg.CurrentContext = "lab"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return err
	}
	// Embed the files so the kubeconfig works wherever it is copied.
	loaded, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return err
	}
	if err := clientcmdapi.FlattenConfig(loaded); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*loaded, path)
}

// generatePKI issues every certificate and kubeconfig the lab uses.
func generatePKI(d dirs) error {
	p, err := newPKI(d)
	if err != nil {
		return err
	}
	specs := []certSpec{
		{name: "apiserver", cn: "kube-apiserver", server: true, ips: []string{labIP, "10.96.0.1", "127.0.0.1"},
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{name: "admin", cn: "admin", org: []string{"system:masters"}},
		{name: "kcm", cn: "system:kube-controller-manager"},
		{name: "scheduler", cn: "system:kube-scheduler"},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", org: []string{"system:masters"}},
	}
	for _, n := range nodes {
		specs = append(specs, certSpec{name: n.Name, cn: "system:node:" + n.Name, org: []string{"system:nodes"}})
	}
	for _, s := range specs {
		if err := p.issue(s); err != nil {
			return err
		}
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err := os.WriteFile(d.pki("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(d.pki("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}), 0o600); err != nil {
		return err
	}
	for _, name := range append([]string{"admin", "kcm", "scheduler"}, nodeNames()...) {
		if err := p.kubeconfig(d.state(name+".kubeconfig"), name); err != nil {
			return err
		}
	}
	return nil
}

func nodeNames() []string {
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	return names
}
