package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/bench/internal/vmwire"
)

// vmConsole is a guest's console as QEMU passes it on: firmware escape
// codes, kernel messages between the guest's lines, a record the kernel
// wrote into the middle of.
const vmConsole = "\x1bc\x1b[?7l\x1b[2JVMTEST PASS mount /proc, /sys\n" +
	"VMTEST PASS load modules\n" +
	"[    5.1] IPVS: Registered protocols (TCP, UDP, SCTP, AH, ESP)\n" +
	`VMTEST NOTE BENCH {"info":{"kernel":"6.1.0-56-cloud-amd64","cpus":2,"memory_mib":972,"cpu_model":"QEMU TCG CPU","iptables":"iptables v1.8.9 (legacy)","loadgen":"built-in Go","http_server":"built-in Go server"}}` + "\n" +
	"VMTEST NOTE step round 1/1 · direct · keep-alive\n" +
	`VMTEST NOTE BENCH {"sample":{"round":1,"mode":"direct","test":"keepalive","metric":"rps","value":4000,"unit":"req/s"}}` + "\n" +
	`VMTEST NOTE BENCH {"sample":{"round":1,"mode":"direct","test":"keepalive","metric":"p99_ms","value":40,"unit":"ms"}}` + "\n" +
	`VMTEST NOTE BENCH {"sample":{"round":1,"mode":"direct","test":"connrate","metric":"conn_per_s","value":300,"unit":"conn/s"}}` + "\n" +
	`[   20.0] random: crng init done VMTEST NOTE BENCH {"sample":{"round":1,"mode":"svcproxy-ipvs","test":"keepalive","metric":"rps","value":3000,"unit":"req/s"}}` + "\r\n" +
	`VMTEST NOTE BENCH {"sample":{"round":1,"mode":"svcproxy-ipvs","test":"keepalive","metric":"p99_ms","value":50,"unit":"ms"}}` + "\n" +
	`VMTEST NOTE BENCH {"sample":{"round":1,"mode":"svcproxy-ipvs","test":"connrate","metric":"conn_per_s","value":150,"unit":"conn/s"}}` + "\n" +
	`VMTEST NOTE BENCH {"sample":{"round":1,"mode":"svcproxy-ipvs","test":"connrate","metric":"syn_retrans_client","value":2,"unit":""}}` + "\n" +
	`VMTEST NOTE BENCH {"control":{"mode":"svcproxy-ipvs","services":1000,"endpoints":10000,"program_s":25.3,"program_total_s":25.6,"changes_ms":[800,500,900],"changes_total_ms":[810,520,950],"notes":["programming: IPVS netlink writes 11000× 11 s"]}}` + "\n" +
	`VMTEST NOTE BENCH {"control":{"mode":"svcproxy-ipvs","services":10000,"endpoints":100000,"program_s":0,"program_total_s":0,"changes_ms":null,"changes_total_ms":null,"skipped":"predicted 413 s from 1,000 Services (41 s), 177 s of the VM's time budget left"}}` + "\n" +
	"VMTEST FAIL svcproxy-ipvs: round 2: cleanup: something\n" +
	`VMTEST NOTE BENCH {"mode":{"name":"direct","describe":"no proxy","status":"ran"}}` + "\n" +
	`VMTEST NOTE BENCH {"mode":{"name":"svcproxy-ipvs","describe":"the IPVS mode","status":"failed","errors":["round 2: cleanup: something"],"notes":["scheduler rr"]}}` + "\n" +
	`VMTEST NOTE BENCH {"info":{"kernel":"6.1.0-56-cloud-amd64","cpus":2,"memory_mib":972,"guest_s":120.5}}` + "\n" +
	"VMTEST DONE pass=2 fail=1 guest_seconds=120.5\n"

func testVM() *VMResults {
	return &VMResults{Label: vmLabel, Kernel: "linux-image-6.1.0-56-cloud-amd64", VCPUs: 2,
		Settings: vmwire.Config{Modes: []string{"direct", "svcproxy-ipvs"}, Rounds: 1, DurationS: 2, Conns: 64, Endpoints: 10, Changes: 3}}
}

func TestVMFill(t *testing.T) {
	vm := testVM()
	vm.fill(vmConsole)
	if vm.Error != "" {
		t.Errorf("Error = %q, want none", vm.Error)
	}
	if len(vm.Samples) != 7 {
		t.Errorf("got %d samples, want 7: %+v", len(vm.Samples), vm.Samples)
	}
	if got := vm.med("svcproxy-ipvs", testKeepAlive, "rps"); got != 3000 {
		t.Errorf("svcproxy-ipvs keep-alive rps %v, want 3000 (the record after a kernel message)", got)
	}
	if vm.GuestS != 120.5 || vm.MemoryMiB != 972 || vm.IPTables != "iptables v1.8.9 (legacy)" {
		t.Errorf("info: guest_s %v, memory %d, iptables %q", vm.GuestS, vm.MemoryMiB, vm.IPTables)
	}
	if len(vm.ControlPlane) != 2 || vm.ControlPlane[0].ProgramS != 25.3 || len(vm.ControlPlane[0].ChangesMs) != 3 || vm.ControlPlane[1].Skipped == "" {
		t.Errorf("control plane: %+v", vm.ControlPlane)
	}
	if len(vm.Modes) != 2 || vm.Modes[1].Name != "svcproxy-ipvs" || vm.Modes[1].Status != "failed" {
		t.Errorf("modes: %+v", vm.Modes)
	}
	if len(vm.Failures) != 1 {
		t.Errorf("failures %v, want the one FAIL line", vm.Failures)
	}
	errs := vm.errors()
	if len(errs) != 1 || !strings.Contains(errs[0], "in the VM, svcproxy-ipvs: round 2: cleanup") {
		t.Errorf("errors() = %q", errs)
	}
}

func TestVMFillTruncated(t *testing.T) {
	// QEMU killed at its timeout half-way: what was printed is kept, the
	// modes never reported are failed, the run is an error.
	vm := testVM()
	cut := strings.Index(vmConsole, `VMTEST NOTE BENCH {"control"`)
	vm.fill(vmConsole[:cut] + `VMTEST NOTE BENCH {"sample":{"round":1,"mode":"svcp` + "\n")
	if len(vm.Samples) != 7 {
		t.Errorf("got %d samples, want the 7 printed", len(vm.Samples))
	}
	if !strings.Contains(vm.Error, "did not finish") || !strings.Contains(vm.Error, "unreadable result lines") {
		t.Errorf("Error = %q, want the unfinished guest and the broken line named", vm.Error)
	}
	if len(vm.Modes) != 2 || vm.Modes[0].Status != "failed" || vm.Modes[1].Status != "failed" {
		t.Errorf("modes: %+v, want both failed", vm.Modes)
	}
}

func TestVMReportApart(t *testing.T) {
	r := &Results{Settings: Settings{Rounds: 1}, Machine: Machine{Cores: 2}}
	for _, m := range []string{"direct", "kube-dnat"} {
		r.Modes = append(r.Modes, &ModeResult{Name: m, Status: "ran"})
		r.add(Sample{Round: 1, Mode: m, Test: testKeepAlive, Metric: "rps", Value: 50000})
	}
	r.Modes = append(r.Modes, &ModeResult{Name: "svcproxy-ipvs", Status: statusVM, Describe: vmDescribe})
	r.VM = testVM()
	r.VM.fill(vmConsole)
	md := r.markdown(r.charts())
	host, vmPart, ok := strings.Cut(md, "## svcproxy-ipvs in a QEMU VM: "+vmLabel)
	if !ok {
		t.Fatalf("results.md has no VM section:\n%s", md)
	}
	vmPart, _, _ = strings.Cut(vmPart, "\n## ")
	if strings.Contains(host, "| svcproxy-ipvs |") || strings.Contains(host, "svcproxy-ipvs (VM)") {
		t.Errorf("svcproxy-ipvs has a row among the host's figures:\n%s", host)
	}
	for _, want := range []string{
		"| **svcproxy-ipvs** (VM) | 3k |",
		"| direct (VM) | 4k |",
		"Against **direct (VM)**",
		"| svcproxy-ipvs (VM) | 0.75× | 1.25× | 0.50× |",
		"| **svcproxy-ipvs** (VM) | 1,000 × 10 | 25.3 | 25.6 | 800 | 900 |",
		"| svcproxy-ipvs (VM) | 10,000 × 10 | skipped: predicted 413 s",
		"- **svcproxy-ipvs** (VM) **FAILED**",
		"not comparable with the host rows",
	} {
		if !strings.Contains(vmPart, want) {
			t.Errorf("the VM section lacks %q:\n%s", want, vmPart)
		}
	}
	if !strings.Contains(md, "- **svcproxy-ipvs**: svcproxy's IPVS mode, run inside a QEMU VM") {
		t.Errorf("the Modes list does not say svcproxy-ipvs ran in the VM:\n%s", md)
	}
	for _, name := range []string{"requests.svg", "connrate.svg"} {
		if c, ok := r.charts()[name]; ok && slices.Contains(c.Groups, "svcproxy-ipvs") {
			t.Errorf("%s has an svcproxy-ipvs bar", name)
		}
	}
}

func TestVMConfig(t *testing.T) {
	cfg := Quick()
	cfg.Modes = []string{"direct", "svcproxy-iptables", "kube-dnat", "svcproxy-ipvs"}
	c, err := vmConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"direct", "svcproxy-iptables", "svcproxy-ipvs"}; !slices.Equal(c.Modes, want) {
		t.Errorf("VM modes %v, want %v", c.Modes, want)
	}
	if want := []string{testKeepAlive, testConnRate, testControl}; !slices.Equal(c.Tests, want) {
		t.Errorf("VM tests %v, want %v", c.Tests, want)
	}
	if !slices.Equal(c.Scales, []int{1000, 10000}) || c.Changes != 20 || c.DurationS != 2 || c.BudgetS <= 180 {
		t.Errorf("VM config %+v", c)
	}
	cfg.Tests = []string{testBulk1, testIdle}
	if _, err := vmConfig(cfg); !errors.Is(err, errSkip) {
		t.Errorf("with no test the VM runs: got %v, want a skip", err)
	}
	cfg.Tests = []string{testKeepAlive}
	if c, err := vmConfig(cfg); err != nil || len(c.Scales) != 0 {
		t.Errorf("keep-alive only: %+v, %v", c, err)
	}
}

func TestIPVSVMFlag(t *testing.T) {
	c, err := parseFlags([]string{"--ipvs-vm"})
	if err != nil || !c.IPVSVM {
		t.Errorf("--ipvs-vm: %+v, %v", c, err)
	}
	if _, err := parseFlags([]string{"--ipvs-vm", "--modes", "direct"}); err == nil {
		t.Error("--ipvs-vm with --modes not naming svcproxy-ipvs was accepted")
	}
	if c, err := parseFlags([]string{"--ipvs-vm", "--modes", "direct,svcproxy-ipvs", "--duration", "3s"}); err != nil || c.Duration != 3*time.Second {
		t.Errorf("got %+v, %v", c, err)
	}
}

func TestVMWireParse(t *testing.T) {
	recs, err := vmwire.Parse([]string{"step round 1", vmwire.Record{Sample: &vmwire.Sample{Mode: "direct", Metric: "rps", Value: 1}}.Line(), "BENCH {broken"})
	if len(recs) != 1 || recs[0].Sample == nil || recs[0].Sample.Value != 1 {
		t.Errorf("records %+v", recs)
	}
	if err == nil || !strings.Contains(err.Error(), "{broken") {
		t.Errorf("error %v, want the broken line named", err)
	}
}
