package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// newCertsCommand mints everything a throw-away control plane needs, in the
// spirit of kubeadm's "certs" and "kubeconfig" phases but without kubeadm's
// dependency tree:
//
//	ca.crt/ca.key                     cluster CA (also the client CA)
//	apiserver.crt/.key                serving cert: 127.0.0.1, ::1, localhost, kubernetes.default.svc...
//	admin.crt/.key                    CN=minik8s-admin, O=system:masters
//	scheduler.crt/.key                CN=system:kube-scheduler (bootstrap RBAC role of that name)
//	controller-manager.crt/.key       CN=system:kube-controller-manager (ditto)
//	sa.key/sa.pub                     service-account token signing key pair
//	webhook.crt/.key                  serving cert for a test webhook, SANs from --webhook-san
//	{admin,scheduler,controller-manager}.kubeconfig
//
// Keys are ECDSA P-256: generation is instant, and the apiserver, client-go,
// Python's ssl module and the service-account token signer (ES256) all accept them.
func newCertsCommand() *cobra.Command {
	var (
		dir         string
		server      string
		webhookSANs []string
		validFor    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "certs --dir DIR --server https://127.0.0.1:PORT [--webhook-san NAME|IP ...]",
		Short: "Generate the CA, certificates, service-account keys and kubeconfigs for minik8s",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if dir == "" || server == "" {
				return fmt.Errorf("--dir and --server are required")
			}
			return writeCerts(dir, server, webhookSANs, validFor)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "output directory (created; existing files are overwritten)")
	cmd.Flags().StringVar(&server, "server", "", "apiserver URL written into the kubeconfigs, e.g. https://127.0.0.1:6443")
	cmd.Flags().StringSliceVar(&webhookSANs, "webhook-san", []string{"127.0.0.1", "localhost"},
		"DNS names and IP addresses for webhook.crt, e.g. NAME.NAMESPACE.svc (repeatable or comma-separated)")
	cmd.Flags().DurationVar(&validFor, "valid-for", 365*24*time.Hour, "certificate lifetime")
	return cmd
}

type keyPair struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func writeCerts(dir, server string, webhookSANs []string, validFor time.Duration) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := newCA("minik8s-ca", validFor)
	if err != nil {
		return err
	}
	if err := writePair(dir, "ca", ca); err != nil {
		return err
	}

	serving := func(name, cn string, sans []string) error {
		kp, err := ca.issue(pkix.Name{CommonName: cn}, sans, x509.ExtKeyUsageServerAuth, validFor)
		if err != nil {
			return err
		}
		return writePair(dir, name, kp)
	}
	// The apiserver serves on loopback only; the in-cluster names are listed
	// because clients built from in-cluster config (and the aggregator's
	// loopback resolver) verify against them.
	if err := serving("apiserver", "kube-apiserver", []string{
		"127.0.0.1", "::1", "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
	}); err != nil {
		return err
	}
	if err := serving("webhook", "minik8s-webhook", webhookSANs); err != nil {
		return err
	}

	clients := []struct {
		file string
		name pkix.Name
	}{
		// system:masters bypasses RBAC entirely (the authorizer short-circuits
		// on that group); this is the identity tests use.
		{"admin", pkix.Name{CommonName: "minik8s-admin", Organization: []string{"system:masters"}}},
		// The scheduler and controller manager use their real identities so
		// the bootstrap RBAC policy (plugin/pkg/auth/authorizer/rbac/bootstrappolicy)
		// is exercised as in a kubeadm cluster.
		{"scheduler", pkix.Name{CommonName: "system:kube-scheduler"}},
		{"controller-manager", pkix.Name{CommonName: "system:kube-controller-manager"}},
	}
	caPEM := pemEncode("CERTIFICATE", ca.cert.Raw)
	for _, c := range clients {
		kp, err := ca.issue(c.name, nil, x509.ExtKeyUsageClientAuth, validFor)
		if err != nil {
			return err
		}
		if err := writePair(dir, c.file, kp); err != nil {
			return err
		}
		if err := writeKubeconfig(filepath.Join(dir, c.file+".kubeconfig"), server, c.file, caPEM, kp); err != nil {
			return err
		}
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "sa.key"), saKey); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sa.pub"), pemEncode("PUBLIC KEY", pub), 0o644)
}

func newCA(cn string, validFor time.Duration) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := baseTemplate(pkix.Name{CommonName: cn}, validFor)
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	tmpl.SubjectKeyId = keyID(key.Public())
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &keyPair{cert: cert, key: key}, nil
}

func (ca *keyPair) issue(subject pkix.Name, sans []string, usage x509.ExtKeyUsage, validFor time.Duration) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := baseTemplate(subject, validFor)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	tmpl.BasicConstraintsValid = true
	tmpl.AuthorityKeyId = ca.cert.SubjectKeyId
	for _, san := range sans {
		if ip := net.ParseIP(san); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if san != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, san)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &keyPair{cert: cert, key: key}, nil
}

func baseTemplate(subject pkix.Name, validFor time.Duration) *x509.Certificate {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		// Back-date a little: certificates minted and used within the same
		// second must not fail on clock granularity or small skew.
		NotBefore: now.Add(-time.Hour),
		NotAfter:  now.Add(validFor),
	}
}

func keyID(pub crypto.PublicKey) []byte {
	der, _ := x509.MarshalPKIXPublicKey(pub)
	sum := sha1.Sum(der) // RFC 5280 4.2.1.2 method (1); not a security use
	return sum[:]
}

func pemEncode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pemEncode("EC PRIVATE KEY", der), 0o600)
}

func writePair(dir, name string, kp *keyPair) error {
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), pemEncode("CERTIFICATE", kp.cert.Raw), 0o644); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, name+".key"), kp.key)
}

func writeKubeconfig(path, server, user string, caPEM []byte, kp *keyPair) error {
	keyDER, err := x509.MarshalECPrivateKey(kp.key)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["minik8s"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: pemEncode("CERTIFICATE", kp.cert.Raw),
		ClientKeyData:         pemEncode("EC PRIVATE KEY", keyDER),
	}
	cfg.Contexts["minik8s"] = &clientcmdapi.Context{Cluster: "minik8s", AuthInfo: user}
	cfg.CurrentContext = "minik8s"
	return clientcmd.WriteToFile(*cfg, path)
}
