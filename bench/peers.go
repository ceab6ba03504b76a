package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// haproxyMode is HAProxy in TCP mode, 2 threads, splice forced on (option
// splice-request/-response: splice-auto almost never splices here), listening
// on the VIPs put on the node's lo. Whether it really splices is checked by
// the syscall profile, not assumed.
type haproxyMode struct{}

func (haproxyMode) Name() string { return "haproxy" }
func (haproxyMode) Describe() string {
	return "HAProxy, mode tcp, nbthread 2, splice forced (option splice-request/splice-response), retries 2 + redispatch, no health checks"
}

func (haproxyMode) Available(e *Env) error {
	if e.Tools.HAProxy == "" {
		return skipf("haproxy is not installed (apt-get install haproxy)")
	}
	return nil
}

func (m haproxyMode) Start(ctx context.Context, c *Cluster) (*Running, error) {
	if err := addVIPs(c); err != nil {
		return nil, err
	}
	var b strings.Builder
	// maxconn: as many connections as the open-files limit allows (two
	// descriptors each, plus two per pipe): HAProxy refuses to start when
	// it cannot raise the limit to what they need. 512 pipes are plenty
	// for 64 spliced connections at a time.
	fmt.Fprintf(&b, `# HAProxy as a peer L4 proxy for svcproxy's bench
global
    nbthread 2
    maxconn %d
    maxpipes 512
`, min(100000, (c.Env.FileLimit-1200)/2))
	b.WriteString(`
defaults
    mode tcp
    timeout connect 1s
    timeout client 1h
    timeout server 1h
    option splice-request
    option splice-response
    retries 2
    option redispatch 1
`)
	for i, s := range tcpServices(c.Services) {
		fmt.Fprintf(&b, "\nlisten svc%d # %s\n    bind %s\n    balance roundrobin\n", i, s.Key(), s.Frontend())
		for j, ep := range s.Endpoints {
			fmt.Fprintf(&b, "    server ep%d %s\n", j, ep)
		}
	}
	conf := filepath.Join(c.Dir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	p, err := c.Start(c.Topo.Node, "haproxy", c.Env.Tools.HAProxy, "-db", "-f", conf)
	if err != nil {
		return nil, err
	}
	if err := waitProcListening(ctx, p, c.Topo.Node, c.Services[0].Frontend()); err != nil {
		return nil, err
	}
	return &Running{
		Targets:  vipTargets(tcpServices(c.Services)),
		PIDs:     func() []int { return []int{p.Pid()} },
		Balances: true,
		Config:   b.String(),
		Stop:     p.Stop,
	}, nil
}

// nginxStreamMode is nginx's stream (L4) proxy with 2 workers, each with its
// own SO_REUSEPORT listener, listening on the VIPs put on the node's lo.
type nginxStreamMode struct{}

func (nginxStreamMode) Name() string { return "nginx-stream" }
func (nginxStreamMode) Describe() string {
	return "nginx stream proxy, 2 workers, listen reuseport, default proxy_next_upstream (retry another upstream on connect failure)"
}

func (nginxStreamMode) Available(e *Env) error {
	switch {
	case e.Tools.Nginx == "":
		return skipf("nginx is not installed (apt-get install nginx-light libnginx-mod-stream)")
	case e.Tools.NginxStream == "":
		return skipf("nginx has no stream module (apt-get install libnginx-mod-stream)")
	}
	return nil
}

func (m nginxStreamMode) Start(ctx context.Context, c *Cluster) (*Running, error) {
	if err := addVIPs(c); err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString("# nginx stream as a peer L4 proxy for svcproxy's bench\n")
	if c.Env.Tools.NginxStream != "static" {
		fmt.Fprintf(&b, "load_module %s;\n", c.Env.Tools.NginxStream)
	}
	fmt.Fprintf(&b, `user root;
worker_processes 2;
worker_rlimit_nofile 200000;
pid %[1]s/nginx-stream.pid;
daemon off;
error_log %[1]s/nginx-stream.error.log warn;
events { worker_connections 60000; }
stream {
    proxy_connect_timeout 1s;
`, c.Dir)
	for i, s := range c.Services {
		fmt.Fprintf(&b, "    upstream svc%d { # %s\n", i, s.Key())
		for _, ep := range s.Endpoints {
			fmt.Fprintf(&b, "        server %s;\n", ep)
		}
		if s.Protocol == "UDP" { // one datagram, one response: the flow ends with it (as DNS wants)
			fmt.Fprintf(&b, "    }\n    server { listen %s udp reuseport; proxy_pass svc%d; proxy_responses 1; proxy_timeout 2s; }\n", s.Frontend(), i)
			continue
		}
		fmt.Fprintf(&b, "    }\n    server { listen %s reuseport backlog=8192; proxy_pass svc%d; }\n", s.Frontend(), i)
	}
	b.WriteString("}\n")
	conf := filepath.Join(c.Dir, "nginx-stream.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	p, err := c.Start(c.Topo.Node, "nginx-stream", c.Env.Tools.Nginx, "-p", c.Dir, "-c", conf, "-e", filepath.Join(c.Dir, "nginx-stream.error.log"))
	if err != nil {
		return nil, err
	}
	if err := waitProcListening(ctx, p, c.Topo.Node, c.Services[0].Frontend()); err != nil {
		return nil, err
	}
	return &Running{
		Targets:  vipTargets(c.Services),
		PIDs:     func() []int { return append([]int{p.Pid()}, children(p.Pid())...) },
		Balances: true,
		Notes:    []string{"CPU and memory are the master's and both workers' together (RSS summed, shared pages counted per process)"},
		Config:   b.String(),
		Stop:     p.Stop,
	}, nil
}
