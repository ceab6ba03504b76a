// Package apiserver runs a real Kubernetes API server for tests: it builds
// kube-apiserver and etcd from the Go module proxy (cached outside the
// repository, see Build), starts them on loopback with a self-signed
// serving certificate, a service-account key pair, static token auth (an
// admin token in group system:masters) and RBAC, and hands back a client.
// No controller manager runs: tests write EndpointSlices themselves.
// Outage tests can kill the API server and restart it at the same address
// (Kill, Restart) and start a second one on the same etcd (StartPeer).
package apiserver

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configure Start. Zero values mean the stated defaults.
type Options struct {
	// ServiceCIDR is --service-cluster-ip-range. Default 10.96.0.0/16
	// (room for 10,000 Services).
	ServiceCIDR string
	// AdvertiseAddress is written into the default/kubernetes Service's
	// endpoints and never contacted. Default 192.0.2.1 (TEST-NET-1).
	AdvertiseAddress string
	// Dir holds the state (etcd data, certificates, logs); "" a new
	// temporary directory, removed by Stop.
	Dir string
	// Logf, if set, is told what is happening (builds, start-up).
	Logf func(format string, args ...any)
}

// Server is a running etcd and kube-apiserver, or (from StartPeer) a
// second kube-apiserver on another Server's etcd.
type Server struct {
	URL        string // https://127.0.0.1:port
	Token      string // the admin's bearer token (group system:masters)
	CAData     []byte // PEM of the CA that signed the serving certificate
	CAFile     string
	Kubeconfig string       // the admin's kubeconfig
	Config     *rest.Config // the admin's client configuration
	Client     kubernetes.Interface
	Dir        string

	ownDir  bool
	bins    Binaries
	opts    Options
	etcdURL string // etcd's client URL
	port    int    // kube-apiserver's --secure-port
	logName string // kube-apiserver's log: Dir/logName.log

	mu    sync.Mutex
	procs []*proc // in start order: etcd (not for a peer), kube-apiserver
	stop  sync.Once
}

// proc is a started process; done is closed once it has exited and been
// reaped.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// StartT builds (or finds cached) binaries and starts a server for tb,
// stopped at cleanup. It skips tb only when the binaries cannot be built
// (no Go module proxy, no toolchain); a server that will not start fails.
func StartT(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if opts.Logf == nil {
		opts.Logf = tb.Logf
	}
	bins, err := Build(context.Background(), opts.Logf)
	if err != nil {
		tb.Skipf("skipping: kube-apiserver and etcd cannot be built here: %v", err)
	}
	s, err := Start(context.Background(), bins, opts)
	if err != nil {
		tb.Fatalf("starting the API server: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("stopping the API server: %v", err)
		}
	})
	return s
}

// Start starts etcd and kube-apiserver and waits until the API server is
// ready and its system namespaces exist.
func Start(ctx context.Context, bins Binaries, opts Options) (_ *Server, err error) {
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = "10.96.0.0/16"
	}
	if opts.AdvertiseAddress == "" {
		opts.AdvertiseAddress = "192.0.2.1"
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	s := &Server{Dir: opts.Dir, logName: "kube-apiserver"}
	if s.Dir == "" {
		if s.Dir, err = os.MkdirTemp("", "svcproxy-apiserver-"); err != nil {
			return nil, err
		}
		s.ownDir = true
	}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	if err := s.writeCredentials(); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	start := time.Now()
	if _, err := s.run("etcd", bins.Etcd,
		"--name=default", "--data-dir="+filepath.Join(s.Dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, &http.Client{Timeout: time.Second}, clientURL+"/health", "", 30*time.Second, s.exited); err != nil {
		return nil, fmt.Errorf("etcd did not become healthy: %w\n%s", err, s.logTail("etcd"))
	}

	s.bins, s.opts, s.etcdURL, s.port = bins, opts, clientURL, ports[2]
	s.URL = "https://127.0.0.1:" + strconv.Itoa(s.port)
	s.Config = s.ConfigFor(s.Token)
	if err := s.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if s.Client, err = kubernetes.NewForConfig(s.Config); err != nil {
		return nil, err
	}
	// The system namespaces and the default/kubernetes Service come from
	// post-start hooks; wait so tests can use them at once.
	deadline := time.Now().Add(30 * time.Second)
	for _, ns := range []string{"default", "kube-system"} {
		for {
			_, err := s.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("namespace %s never appeared: %w", ns, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for {
		_, err := s.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the default/kubernetes Service never appeared: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.Kubeconfig = filepath.Join(s.Dir, "admin.kubeconfig")
	if err := s.WriteKubeconfig(s.Kubeconfig, s.Token); err != nil {
		return nil, err
	}
	opts.Logf("kube-apiserver %s ready at %s in %v (state in %s)", KubernetesVersion, s.URL, time.Since(start).Round(time.Millisecond), s.Dir)
	return s, nil
}

// ConfigFor returns a client configuration for the server with token.
func (s *Server) ConfigFor(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.CAData},
		QPS:             1000,
		Burst:           2000,
		UserAgent:       "svcproxy-test",
	}
}

// WriteKubeconfig writes a kubeconfig for the server with token to path.
func (s *Server) WriteKubeconfig(path, token string) error {
	return WriteKubeconfig(path, s.URL, s.CAData, token)
}

// WriteKubeconfig writes a kubeconfig for server (https URL), trusting ca,
// authenticating with token.
func WriteKubeconfig(path, server string, ca []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}

// startAPIServer starts kube-apiserver on s.port against s.etcdURL and
// waits until it is ready.
func (s *Server) startAPIServer(ctx context.Context) error {
	d := func(name string) string { return filepath.Join(s.Dir, name) }
	if _, err := s.run(s.logName, s.bins.APIServer,
		"--etcd-servers="+s.etcdURL,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(s.port),
		"--advertise-address="+s.opts.AdvertiseAddress,
		"--tls-cert-file="+d("serving.crt"), "--tls-private-key-file="+d("serving.key"),
		"--cert-dir="+d("certs"),
		"--token-auth-file="+d("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+d("sa.pub"), "--service-account-signing-key-file="+d("sa.key"),
		"--service-cluster-ip-range="+s.opts.ServiceCIDR,
		"--allow-privileged=true",
		"--profiling=false",
		"--v=0"); err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(s.Config)
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, hc, s.URL+"/readyz", s.Token, 90*time.Second, s.exited); err != nil {
		return fmt.Errorf("kube-apiserver did not become ready: %w\n%s", err, s.logTail(s.logName))
	}
	return nil
}

// Kill SIGKILLs kube-apiserver, as a crash or an OOM kill would, and waits
// until it is gone; etcd keeps running. Clients of the server then see
// their connections closed and new ones refused until Restart.
func (s *Server) Kill() error {
	p := s.apiserver()
	if p == nil {
		return errors.New("kube-apiserver was never started")
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing kube-apiserver: %w", err)
	}
	<-p.done
	return nil
}

// Restart starts kube-apiserver again after Kill (or after it died) with
// the same flags: the same address and port, certificates, token and etcd,
// so Config, Client and Kubeconfig work again as they are. It waits until
// the server is ready. Its log goes on in the same file.
func (s *Server) Restart(ctx context.Context) error {
	p := s.apiserver()
	if p == nil {
		return errors.New("kube-apiserver was never started")
	}
	select {
	case <-p.done:
	default:
		return errors.New("kube-apiserver is still running: Kill it first")
	}
	start := time.Now()
	if err := s.startAPIServer(ctx); err != nil {
		return err
	}
	s.opts.Logf("kube-apiserver restarted at %s, ready in %v", s.URL, time.Since(start).Round(time.Millisecond))
	return nil
}

// StartPeer starts another kube-apiserver on s's etcd, on a new port, with
// the same certificates, token and Service range, as a highly available
// control plane has: what is written through one is read through the
// other. It waits until the peer is ready. The peer shares s's state
// directory (its log is kube-apiserver-<port>.log); its Stop, Kill and
// Restart act on it alone. Stop it before s, whose Stop also stops etcd.
func (s *Server) StartPeer(ctx context.Context) (_ *Server, err error) {
	if s.etcdURL == "" {
		return nil, errors.New("StartPeer: the server was never started")
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	peer := &Server{
		URL:     "https://127.0.0.1:" + strconv.Itoa(ports[0]),
		Token:   s.Token,
		CAData:  s.CAData,
		CAFile:  s.CAFile,
		Dir:     s.Dir,
		bins:    s.bins,
		opts:    s.opts,
		etcdURL: s.etcdURL,
		port:    ports[0],
		logName: "kube-apiserver-" + strconv.Itoa(ports[0]),
	}
	defer func() {
		if err != nil {
			_ = peer.Stop()
		}
	}()
	peer.Config = peer.ConfigFor(peer.Token)
	start := time.Now()
	if err := peer.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if peer.Client, err = kubernetes.NewForConfig(peer.Config); err != nil {
		return nil, err
	}
	peer.Kubeconfig = filepath.Join(s.Dir, "admin-"+strconv.Itoa(peer.port)+".kubeconfig")
	if err := peer.WriteKubeconfig(peer.Kubeconfig, peer.Token); err != nil {
		return nil, err
	}
	s.opts.Logf("peer kube-apiserver ready at %s in %v (same etcd as %s)", peer.URL, time.Since(start).Round(time.Millisecond), s.URL)
	return peer, nil
}

// Stop stops kube-apiserver then etcd (a peer: its kube-apiserver only),
// and removes the state directory if Start made it.
func (s *Server) Stop() error {
	var errs []error
	s.stop.Do(func() {
		s.mu.Lock()
		procs := s.procs
		s.mu.Unlock()
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].terminate(15 * time.Second)
		}
		if s.ownDir {
			if err := os.RemoveAll(s.Dir); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// Log returns the named process's log ("etcd" or "kube-apiserver"; a
// peer's is "kube-apiserver-<port>"), across restarts.
func (s *Server) Log(name string) string {
	data, _ := os.ReadFile(filepath.Join(s.Dir, name+".log"))
	return string(data)
}

func (s *Server) logTail(name string) string { return tail(s.Log(name), 3000) }

// run starts bin, appending its output to Dir/name.log, and replaces any
// earlier process of that name in s.procs (one that has exited: Restart).
func (s *Server) run(name, bin string, args ...string) (*proc, error) {
	log, err := os.OpenFile(filepath.Join(s.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	if fi, err := log.Stat(); err == nil && fi.Size() > 0 {
		fmt.Fprintf(log, "\n=== test harness: %s started again at %s ===\n", name, time.Now().Format(time.RFC3339Nano))
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Die with the test process, even when it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, old := range s.procs {
		if old.name == name {
			s.procs[i] = p
			return p, nil
		}
	}
	s.procs = append(s.procs, p)
	return p, nil
}

// apiserver returns the kube-apiserver process last started, or nil.
func (s *Server) apiserver() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		if p.name == s.logName {
			return p
		}
	}
	return nil
}

// exited reports a started process that has already died.
func (s *Server) exited() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v", p.name, p.cmd.ProcessState)
		default:
		}
	}
	return nil
}

// terminate sends SIGTERM and waits up to grace for p to exit, then
// SIGKILLs it. A process that has already exited is left alone.
func (p *proc) terminate(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func waitHTTP(ctx context.Context, c *http.Client, url, token string, timeout time.Duration, dead func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if err := dead(); err != nil {
			return err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s: %s", url, resp.Status, tail(string(body), 500))
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("after %v: %w", timeout, last)
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeCredentials writes the CA and serving certificate, the
// service-account key pair and the static token file.
func (s *Server) writeCredentials() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "svcproxy-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	pemOf := func(typ string, der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}) }
	keyDER, _ := x509.MarshalECPrivateKey(key)
	saDER, _ := x509.MarshalECPrivateKey(saKey)
	saPub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	s.Token = fmt.Sprintf("%x", tok)
	s.CAData = pemOf("CERTIFICATE", caDER)
	s.CAFile = filepath.Join(s.Dir, "ca.crt")
	files := map[string][]byte{
		"ca.crt":      s.CAData,
		"serving.crt": pemOf("CERTIFICATE", der),
		"serving.key": pemOf("EC PRIVATE KEY", keyDER),
		"sa.key":      pemOf("EC PRIVATE KEY", saDER),
		"sa.pub":      pemOf("PUBLIC KEY", saPub),
		"tokens.csv":  []byte(s.Token + `,admin,admin-uid,"system:masters"` + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(s.Dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(s.Dir, "certs"), 0o700)
}

// Dump returns the named process's last log lines, for a failing test.
func (s *Server) Dump() string {
	var b bytes.Buffer
	for _, name := range []string{"etcd", s.logName} {
		fmt.Fprintf(&b, "--- %s log (tail) ---\n%s\n", name, strings.TrimSpace(s.logTail(name)))
	}
	return b.String()
}
