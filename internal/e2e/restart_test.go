package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/internal/topology"
)

// TestPrivilegedRestartUnderLoad restarts svcproxy three times (SIGUSR2:
// the binary on disk starts and takes the running one's sockets) under a
// steady load of new connections and a few long-lived streams: no
// connection fails, and every stream arrives byte-exact: with REDIRECT
// steering, and with local steering (the successor adopts the dummy
// interface and its virtual IPs as they are). A cloud load balancer's
// health check, polling a Local Service's healthCheckNodePort throughout,
// always hears 200 with its local endpoint: a restart must not take the
// node out of the load balancer.
func TestPrivilegedRestartUnderLoad(t *testing.T) {
	for _, steering := range []string{"redirect", "local"} {
		t.Run(steering, func(t *testing.T) { testRestartUnderLoad(t, steering) })
	}
}

func testRestartUnderLoad(t *testing.T, steering string) {
	c := newCluster(t, 3, hcService, "--drain-timeout", "60s", "--steering="+steering)
	client := c.topo.Clients[0]
	hc := c.pollHealthCheck(client)

	// Long-lived streams through the echo Service, checked byte for byte.
	type stream struct {
		sent, got [32]byte
		err       error
	}
	const streams = 3
	results := make([]stream, streams)
	stopStreams := make(chan struct{})
	var sw sync.WaitGroup
	for i := range results {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := client.Dial(ctx, "tcp", echoVIP+":9000")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(conn)
		if _, err := r.ReadString('\n'); err != nil { // the backend's name
			t.Fatal(err)
		}
		sw.Add(2)
		sent := sha256.New()
		go func() { // writer
			defer sw.Done()
			rng := rand.NewChaCha8([32]byte{byte(i)})
			buf := make([]byte, 4096)
			for {
				select {
				case <-stopStreams:
					copy(results[i].sent[:], sent.Sum(nil))
					conn.(interface{ CloseWrite() error }).CloseWrite()
					return
				case <-time.After(5 * time.Millisecond):
				}
				_, _ = rng.Read(buf)
				sent.Write(buf)
				if _, err := conn.Write(buf); err != nil {
					results[i].err = fmt.Errorf("writing: %w", err)
					copy(results[i].sent[:], sent.Sum(nil))
					return
				}
			}
		}()
		go func() { // reader
			defer sw.Done()
			defer conn.Close()
			got := sha256.New()
			if _, err := io.Copy(got, r); err != nil && results[i].err == nil {
				results[i].err = fmt.Errorf("reading: %w", err)
			}
			copy(results[i].got[:], got.Sum(nil))
		}()
	}

	// A steady stream of new connections.
	load := c.startLoad(client, webVIP+":80")

	time.Sleep(time.Second)
	var predecessors []int
	for restart := 1; restart <= 3; restart++ {
		old := c.pid()
		predecessors = append(predecessors, old)
		before := load.ok.Load()
		if err := syscall.Kill(old, syscall.SIGUSR2); err != nil {
			t.Fatalf("restart %d: signalling svcproxy %d: %v", restart, old, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for c.pid() == old {
			if time.Now().After(deadline) {
				t.Fatalf("restart %d: no successor after 30s; output:\n%s", restart, c.proxyOut)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(1500 * time.Millisecond) // the successor serves; the old one drains
		t.Logf("restart %d: svcproxy %d → %d; %d requests meanwhile", restart, old, c.pid(), load.ok.Load()-before)
	}
	load.stop()
	close(stopStreams)
	sw.Wait()
	if polls, bad, first := hc.stop(); polls == 0 || bad > 0 {
		t.Errorf("health check: %d of %d polls not answered 200 with its local endpoint; first: %v", bad, polls, first)
	} else {
		t.Logf("health check: %d polls across 3 restarts, all 200", polls)
	}

	ok, failed := load.ok.Load(), load.failed.Load()
	if failed > 0 {
		t.Errorf("%d of %d connections failed across 3 restarts; first: %v", failed, failed+ok, load.firstErr.Load())
	}
	for i, s := range results {
		if s.err != nil || !bytes.Equal(s.sent[:], s.got[:]) {
			t.Errorf("stream %d: err %v, byte-exact %v", i, s.err, bytes.Equal(s.sent[:], s.got[:]))
		}
	}
	// Every successor took the sockets over (none bound anew beside a
	// predecessor that would then serve on, orphaned), and every
	// predecessor, its streams ended, has drained and exited.
	if n := strings.Count(c.proxyOut.String(), "taking over the sockets of the running svcproxy"); n != 3 {
		t.Errorf("%d of 3 successors took over their predecessor's sockets", n)
	}
	for _, pid := range predecessors {
		if !proctest.WaitGone(pid, 15*time.Second) {
			t.Errorf("predecessor %d still runs 15s after its last connection ended", pid)
			proctest.Quit(pid)
		}
	}
	if failed > 0 || t.Failed() {
		t.Logf("output:\n%s", c.proxyOut)
	}
	t.Logf("%d connections across 3 restarts, %d failed; %d long-lived streams byte-exact", ok+failed, failed, streams)
}

// hcService is a LoadBalancer Service with externalTrafficPolicy Local and
// one endpoint on the node (backend 0), whose health check is answered on
// hcPort of the node.
const (
	hcPort    = 30999
	hcService = `  - name: hc
    namespace: e2e
    loadBalancerIPs: [198.19.2.20]
    externalTrafficPolicy: Local
    healthCheckNodePort: 30999
    ports:
      - port: 80
        targetPort: 8080
    endpoints:
      - ip: 198.18.2.1
        nodeName: node
`
)

// hcPoller is a load balancer's health check: a GET of hcPort every 20 ms.
type hcPoller struct {
	stopc, done chan struct{}
	once        sync.Once
	polls, bad  int
	first       error
}

// pollHealthCheck waits for hcService's health check to answer from h, then
// polls it until stop.
func (c *cluster) pollHealthCheck(h *topology.Host) *hcPoller {
	c.t.Helper()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: h.Dial, DisableKeepAlives: true}}
	url := fmt.Sprintf("http://%s:%d/", topology.NodeAddr, hcPort)
	check := func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		switch {
		case err != nil:
			return err
		case resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"localEndpoints":1`):
			return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
		}
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for err := check(); err != nil; err = check() {
		if time.Now().After(deadline) {
			c.t.Fatalf("the health check of %s does not answer: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p := &hcPoller{stopc: make(chan struct{}), done: make(chan struct{})}
	c.t.Cleanup(func() { p.stop() }) // when the test ends early
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stopc:
				return
			case <-time.After(20 * time.Millisecond):
			}
			p.polls++
			if err := check(); err != nil {
				if p.bad++; p.first == nil {
					p.first = err
				}
			}
		}
	}()
	return p
}

// stop ends the polls and says how many there were, how many failed, and
// the first failure.
func (p *hcPoller) stop() (polls, bad int, first error) {
	p.once.Do(func() { close(p.stopc) })
	<-p.done
	return p.polls, p.bad, p.first
}
