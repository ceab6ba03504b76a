package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/internal/topology"
)

// TestPrivilegedRolloutUnderLoad rolls svcproxy over twice the way
// deploy/daemonset.yaml's update strategy does, under a steady load of new
// connections: each new "pod" is a fresh process started with the
// manifest's own args, ConfigMap and volume mounts while the old one
// serves; the old one gets SIGTERM as kubelet sends it — once at once,
// before the new one has taken over (its probes answer from the old one's
// shared host port), once after. Not one connection may fail, and the old
// process must neither exit before it is told to (kubelet would restart
// it) nor leave the node unsteered. With the ConfigMap as shipped, with its
// steering switched to local, and from a first pod without --master-worker
// (the manifest before it turned the master on) to pods with it. Then,
// as the manifest runs a master, the last pod's worker is killed: its
// master must still keep the sockets for the next (crashWorker).
func TestPrivilegedRolloutUnderLoad(t *testing.T) {
	proctest.NeedTools(t, "unshare", "mount")
	for _, tc := range []struct{ name, steering, firstWithout string }{
		{"as shipped", "", ""},
		{"local", "local", ""},
		{"from a pod without a master", "", "--master-worker"},
	} {
		t.Run(tc.name, func(t *testing.T) { testRolloutUnderLoad(t, tc.steering, tc.firstWithout) })
	}
}

// testRolloutUnderLoad runs the rollouts; firstWithout, if set, is an arg
// of the manifest's that the first pod runs without.
func testRolloutUnderLoad(t *testing.T, steering, firstWithout string) {
	c := newNode(t, 3, "")
	pod := newPodSpec(t, c, steering)
	client := c.topo.Clients[0]

	// The init container sets the ConfigMap's conntrack section (kube-proxy's
	// defaults) in the node's namespace; the pods then find nothing to set.
	closeWait := func() string {
		out, err := exec.Command("ip", "netns", "exec", c.topo.Node.NS, "cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait").Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	if v := closeWait(); v == "3600" {
		t.Fatalf("the node's namespace starts with nf_conntrack_tcp_timeout_close_wait at 3600: nothing to prove")
	}
	initOut := pod.init(t)
	if v := closeWait(); v != "3600" {
		t.Fatalf("after the init container, nf_conntrack_tcp_timeout_close_wait = %s, want 3600 (kube-proxy's default):\n%s", v, initOut)
	}

	first := pod
	if firstWithout != "" {
		first = pod.without(t, firstWithout)
	}
	p := first.start("pod-0")
	targets := []string{webVIP + ":80", fmt.Sprintf("%s:%d", topology.NodeAddr, webNode)} // a ClusterIP, and a NodePort
	c.waitServing(t, p, targets...)

	load := c.startLoad(client, targets...)
	time.Sleep(time.Second)

	for i, sigtermAt := range []string{"at once", "after the takeover"} {
		old := p
		before := load.ok.Load()
		p = pod.start(fmt.Sprintf("pod-%d", i+1))
		if sigtermAt == "at once" {
			old.Signal(t, syscall.SIGTERM)
		}
		if !waitFor(30*time.Second, func() bool { return strings.Contains(p.Out.String(), "taking over the sockets") }) {
			t.Fatalf("rollout %d: the new pod did not take over within 30s; new:\n%s\nold:\n%s", i+1, p.Out, old.Out)
		}
		if sigtermAt == "after the takeover" {
			if !waitFor(10*time.Second, func() bool { return strings.Contains(old.Out.String(), "waiting to be terminated") }) {
				t.Fatalf("rollout %d: the old pod did not finish its handover within 10s:\n%s", i+1, old.Out)
			}
			time.Sleep(time.Second)
			if old.Exited() {
				t.Fatalf("rollout %d: the old pod exited before it was terminated (kubelet would restart it):\n%s", i+1, old.Out)
			}
			old.Signal(t, syscall.SIGTERM)
		}
		if err := old.Wait(15 * time.Second); err != nil {
			t.Fatalf("rollout %d: the old pod: %v\n%s", i+1, err, old.Out)
		}
		time.Sleep(time.Second) // the new pod alone serves
		t.Logf("rollout %d (SIGTERM %s): %d requests meanwhile", i+1, sigtermAt, load.ok.Load()-before)
		if out := old.Out.String(); strings.Contains(out, "removed steering rules") || strings.Contains(out, "removed the virtual IPs") {
			t.Errorf("rollout %d: the old pod removed the steering the new one serves by", i+1)
		}
	}
	rolloutFailed := load.failed.Load()
	var crashFailed int64
	if slices.Contains(pod.args, "--master-worker") {
		crashFailed = crashWorker(t, p, load)
	}
	load.stop()
	// (nf_conntrack_max may be named on a node with many CPUs: the table's
	// size is the node's first namespace's, read-only here.)
	if out := p.Out.String(); strings.Contains(out, "nf_conntrack_tcp_timeout") {
		t.Errorf("a pod set (or failed to set) a timeout the init container had set:\n%s", out)
	}
	ok, failed := load.ok.Load(), load.failed.Load()
	if rolloutFailed > 0 {
		t.Errorf("%d of %d connections failed across 2 rollouts; first: %v", rolloutFailed, failed+ok, load.firstErr.Load())
	}
	// As TestPrivilegedCrashUnderLoad: at most those in flight in the
	// killed worker (4 clients, one connection open each, and a few the
	// dying worker had just accepted).
	if crashFailed > 8 {
		t.Errorf("%d connections failed when the last pod's worker was killed, want at most 8", crashFailed)
	}
	if ok < 100 {
		t.Errorf("only %d requests in the run: the load did not run", ok)
	}
	t.Logf("%d connections across 2 rollouts and a worker crash: %d failed in the rollouts, %d in the crash", ok+failed, rolloutFailed, crashFailed)
}

// crashWorker kills the worker of pod p (a master) with SIGKILL under the
// load, and waits until a new worker serves with the sockets the master
// kept. The master must still have its keeper after the rollouts that
// made it the node's: the old pod's master, stopping, must not have taken
// it away. It returns the connections that failed meanwhile.
func crashWorker(t *testing.T, p *proctest.Process, load *load) int64 {
	t.Helper()
	kids := children(p.Cmd.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("%s: the master has children %v, want one worker", p.Name, kids)
	}
	failed, ok := load.failed.Load(), load.ok.Load()
	if err := syscall.Kill(kids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if !waitFor(20*time.Second, func() bool {
		return strings.Contains(p.Out.String(), "taking over the sockets the master kept") && load.ok.Load() > ok+50
	}) {
		t.Fatalf("%s: no worker served with the kept sockets within 20s of the kill:\n%s", p.Name, p.Out)
	}
	n := load.failed.Load() - failed
	t.Logf("%s: its worker killed after the rollouts: serving again after %v, %d connections failed",
		p.Name, time.Since(start).Round(time.Millisecond), n)
	return n
}

// podSpec is deploy/daemonset.yaml's container as this test runs it on its
// node namespace: the manifest's args (with $(NODE_NAME)), the ConfigMap's
// config.yaml, and its volumes. Volumes mounted under /run are
// bind-mounted for real into a private mount namespace whose /run is an
// empty read-only tmpfs (the container's read-only root filesystem), so a
// path the manifest does not mount cannot be written; other mounts are
// directories of this test, their paths rewritten in the args and the
// configuration. The Service source is this test's services file, as no
// API server runs here.
type podSpec struct {
	c        *cluster
	args     []string
	initArgs []string          // the init container's
	mounts   map[string]string // under /run: mountPath → the node's path
}

func newPodSpec(t *testing.T, c *cluster, steering string) *podSpec {
	t.Helper()
	var ds appsv1.DaemonSet
	readManifest(t, "daemonset.yaml", &ds)
	var cm corev1.ConfigMap
	readManifest(t, "configmap.yaml", &cm)
	if steering != "" { // the ConfigMap's svcproxy.steering, as an operator would edit it
		switched := false
		for key, data := range cm.Data {
			if re := regexp.MustCompile(`(?m)^(\s+steering:) redirect$`); re.MatchString(data) {
				cm.Data[key], switched = re.ReplaceAllString(data, "$1 "+steering), true
			}
		}
		if !switched {
			t.Fatal("configmap.yaml: no `steering: redirect` line to switch")
		}
	}

	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Fatalf("daemonset.yaml: the rollout this test proves starts the new pod first (maxSurge ≥ 1, maxUnavailable: 0); got %+v", ru)
	}
	ctr := ds.Spec.Template.Spec.Containers[0]
	if sc := ctr.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Fatal("daemonset.yaml: this test emulates readOnlyRootFilesystem: true; update it with the manifest")
	}

	node := filepath.Join(c.dir, "node") // the node's filesystem
	volumes := map[string]string{}       // volume name → directory or file on the node
	for _, v := range ds.Spec.Template.Spec.Volumes {
		switch {
		case v.HostPath != nil:
			path := filepath.Join(node, v.HostPath.Path)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			var err error
			if v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathFileOrCreate {
				err = os.WriteFile(path, nil, 0o600)
			} else {
				err = os.Mkdir(path, 0o755)
			}
			if err != nil {
				t.Fatal(err)
			}
			volumes[v.Name] = path
		case v.ConfigMap != nil:
			dir := filepath.Join(c.dir, "configmap-"+v.Name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			volumes[v.Name] = dir
			if v.ConfigMap.Name != cm.Name {
				continue // kubeadm's kube-proxy kubeconfig: not on this node (the source is a file)
			}
			for key, data := range cm.Data {
				volumes[v.Name+"/"+key] = data
			}
		default:
			t.Fatalf("daemonset.yaml: volume %s of a kind this test cannot provide", v.Name)
		}
	}
	p := &podSpec{c: c, mounts: map[string]string{}}
	rewrite := map[string]string{} // mountPath → the test's directory
	for _, m := range ctr.VolumeMounts {
		path, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("daemonset.yaml: mount of an undeclared volume %s", m.Name)
		}
		if strings.HasPrefix(m.MountPath, "/run/") {
			p.mounts[m.MountPath] = path
		} else {
			rewrite[m.MountPath] = path
		}
	}
	rewritten := func(s string) string {
		for from, to := range rewrite {
			s = strings.ReplaceAll(s, from+"/", to+"/")
		}
		return s
	}
	// The ConfigMap's files, their paths rewritten like the args'.
	for key := range cm.Data {
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
				if err := os.WriteFile(filepath.Join(volumes[v.Name], key), []byte(rewritten(volumes[v.Name+"/"+key])), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, a := range ctr.Args {
		p.args = append(p.args, rewritten(strings.ReplaceAll(a, "$(NODE_NAME)", "node")))
	}
	inits := ds.Spec.Template.Spec.InitContainers
	if len(inits) != 1 || !slices.Contains(inits[0].Args, "--init-only") || inits[0].Image != ctr.Image {
		t.Fatal("daemonset.yaml: this test runs one init container, svcproxy --init-only from the svcproxy container's image")
	}
	for _, m := range inits[0].VolumeMounts {
		if rewrite[m.MountPath] == "" {
			t.Fatalf("daemonset.yaml: the init container mounts %s, which the svcproxy container does not", m.MountPath)
		}
	}
	for _, a := range inits[0].Args {
		p.initArgs = append(p.initArgs, rewritten(a))
	}
	// The source: this test's services file instead of the API server.
	p.args = append(p.args, "--kubeconfig=", "--services="+filepath.Join(c.dir, "services.yaml"))
	return p
}

// readManifest decodes deploy/name, the file holding exactly one object.
func readManifest(t *testing.T, name string, into any) {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "deploy", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("deploy/%s: %v", name, err)
	}
}

// podScript runs in the pod's mount namespace: /run becomes the container's
// own (empty, then read-only), with the manifest's /run mounts bound in;
// then it becomes svcproxy. $1.. are pairs of mountPath and node path, "--",
// then the command.
const podScript = `set -e
mount -t tmpfs -o mode=0755 svcproxy-pod-run /run
while [ "$1" != -- ]; do
	if [ -d "$2" ]; then mkdir -p "$1"; else mkdir -p "$(dirname "$1")"; : > "$1"; fi
	mount --bind "$2" "$1"
	shift 2
done
shift
mount -o remount,ro /run
exec "$@"`

// init runs the init container on the node's network namespace, as
// kubelet does before a pod's first container, and fails t unless it
// succeeds. It is privileged: no mount namespace of its own.
func (p *podSpec) init(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", p.c.topo.Node.NS, bins.svcproxy}, p.initArgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("the init container (svcproxy %s): %v\n%s", strings.Join(p.initArgs, " "), err, out)
	}
	return string(out)
}

// without returns p without the manifest's arg a.
func (p *podSpec) without(t *testing.T, a string) *podSpec {
	t.Helper()
	q := *p
	q.args = slices.DeleteFunc(slices.Clone(p.args), func(s string) bool { return s == a })
	if len(q.args) == len(p.args) {
		t.Fatalf("daemonset.yaml: the svcproxy container has no %s arg", a)
	}
	return &q
}

// start starts a pod: svcproxy in a fresh mount namespace on the node's
// network namespace, as kubelet starts the DaemonSet's container.
func (p *podSpec) start(name string) *proctest.Process {
	t := p.c.t
	t.Helper()
	args := []string{"netns", "exec", p.c.topo.Node.NS, "unshare", "--mount", "--propagation", "private", "sh", "-c", podScript, name}
	for mountPath, path := range p.mounts {
		args = append(args, mountPath, path)
	}
	args = append(args, "--", bins.svcproxy)
	args = append(args, p.args...)
	cmd := exec.Command("ip", args...)
	cmd.WaitDelay = 5 * time.Second
	return proctest.Start(t, name, cmd) // ip, unshare and sh exec: the PID is svcproxy's
}

// waitServing waits until each of addrs answers from the client.
func (c *cluster) waitServing(t *testing.T, pp *proctest.Process, addrs ...string) {
	t.Helper()
	if len(addrs) == 0 {
		t.Fatal("waitServing: no address to wait for")
	}
	// Each address: a first sync binds its frontends one after the other
	// (local steering), so one answering says nothing of the next.
	for _, addr := range addrs {
		if !waitFor(20*time.Second, func() bool { _, err := c.get(c.topo.Clients[0], addr); return err == nil }) {
			t.Fatalf("%s did not serve %s within 20s; output:\n%s", pp.Name, addr, pp.Out)
		}
	}
}

// waitFor polls cond every 50ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
