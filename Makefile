# svcproxy — see README.md. `make run` and `make test` are the two set-up
# commands; everything else is for developers.

GO       ?= go
BIN      := bin
PKGS     := ./...

.PHONY: all build run run-deps test-deps run-static bench bench-full bench-ipvs-vm test test-kube bench-kube test-short test-vm bench-go fuzz deps clean

all: build

build:
	$(GO) build -o $(BIN)/svcproxy ./cmd/svcproxy
	$(GO) build -o $(BIN)/svcproxy-backend ./cmd/svcproxy-backend
	$(GO) build -o $(BIN)/svcproxy-sandbox ./cmd/svcproxy-sandbox

# The first command a newcomer runs (as root): a self-contained sandbox of
# network namespaces with real backends and svcproxy steering a ClusterIP
# and a NodePort; it says which steering backend svcproxy chose
# (STEERING_BACKEND=iptables or nftables picks one; empty: auto), or with
# STEERING=local shows the virtual IPs on svcproxy's dummy interface and no
# rules. Ctrl-C removes everything.
STEERING_BACKEND ?=
STEERING ?= redirect
run: run-deps build
	$(BIN)/svcproxy-sandbox --svcproxy $(BIN)/svcproxy --backend $(BIN)/svcproxy-backend --steering "$(STEERING)" --steering-backend "$(STEERING_BACKEND)"

# The node's container image without a Docker daemon: a Debian bookworm
# root filesystem from mmdebstrap with iptables (legacy and nf_tables),
# ipset and conntrack (cached in ~/.cache/svcproxy/rootfs), and the static
# svcproxy on top; bin/svcproxy-image.tar is for docker load, podman load or
# ctr images import. `IMAGE=registry/repo:tag make image-push` pushes it
# instead. deploy/Dockerfile is the route for Docker users.
IMAGE_TOOLS := mmdebstrap:mmdebstrap
.PHONY: image image-push
image:
	$(call install,$(IMAGE_TOOLS),fail)
	$(GO) run ./deploy/image --out $(BIN)/svcproxy-image.tar

image-push:
	@[ -n "$(IMAGE)" ] || { echo "make: say where: IMAGE=registry/repo:tag make image-push"; exit 1; }
	$(call install,$(IMAGE_TOOLS),fail)
	$(GO) run ./deploy/image --push $(IMAGE)

# svcproxy alone on its embedded example services file (loopback, no rules).
run-static: build
	$(BIN)/svcproxy --conn-log=-

# vet, then every test with the race detector, then the allocation tests
# without it (sync.Pool is not deterministic under -race). As root on Debian it first
# installs what the namespace tests need (test-deps), so they run rather
# than skip; as another user it says which tests will skip and why.
test: test-deps
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 60m $(PKGS)
	$(GO) test -count=1 -run 'Allocs' $(PKGS)
	SVCPROXY_FORWARDER_ENGINE=goroutines $(GO) test -race -count=1 -timeout 10m ./forwarder/
	SVCPROXY_FORWARDER_IO_URING=off $(GO) test -race -count=1 -timeout 10m ./forwarder/
	$(MAKE) fuzz FUZZEXECS=10000
	$(MAKE) test-kube

# End to end against a real kube-apiserver and etcd, built once from the Go
# module proxy into ~/.cache/svcproxy-k8s (about ten minutes the first time
# on two cores); its own Go module under test/.
test-kube:
	cd test && $(GO) vet ./... && $(GO) test -count=1 -timeout 40m ./...

# Watch-to-programmed latency at 1,000 and 10,000 Services (slow: creating
# 10,000 Services takes minutes).
bench-kube:
	cd test && $(GO) test -run '^$$' -bench WatchToProgrammed -benchtime 30x -timeout 60m ./e2e

test-short:
	$(GO) test -short -count=1 $(PKGS)

# The IPVS mode's real-kernel test alone: a Debian cloud kernel under QEMU
# (this machine's kernel has no IPVS). `make test` runs it too when
# qemu-system-x86_64 is installed, and skips it with a message otherwise.
test-vm:
	$(GO) test -count=1 -v -run TestPrivilegedIPVSInVM ./kernelmodes/ipvs/
	$(GO) test -count=1 -v -timeout 30m -run TestPrivilegedSoakInVM ./internal/e2e/

# The benchmark suite: userspace vs kernel DNAT vs direct and peer proxies,
# in its own namespaces; results/<time>/results.md, results.json, charts.
bench:
	$(GO) run ./bench --quick --out results

bench-full:
	$(GO) run ./bench --full --out results

# The quick suite plus svcproxy-ipvs measured in a QEMU VM (emulated CPU:
# its figures get their own section, never the host's ratios).
bench-ipvs-vm:
	$(GO) run ./bench --ipvs-vm --out results

# Go micro-benchmarks of the hot paths.
bench-go:
	$(GO) test -run=x -bench=. -benchmem $(PKGS)

# Bounded fuzzing of every parser, converter and rule generator
# (seeds committed under testdata/fuzz). The budget is a count of
# executions, not a duration: Go 1.26's fuzz coordinator can fail a
# duration-bounded run with a spurious "context deadline exceeded" when the
# deadline races a busy worker (golang/go#75804, fixed in Go 1.27).
FUZZEXECS ?= 100000
fuzz:
	$(GO) test -run=x -fuzz=FuzzParse -fuzztime=$(FUZZEXECS)x ./source/file
	$(GO) test -run=x -fuzz=FuzzConvert -fuzztime=$(FUZZEXECS)x ./source/kube
	$(GO) test -run=x -fuzz=FuzzParse -fuzztime=$(FUZZEXECS)x ./config
	$(GO) test -run=x -fuzz=FuzzApply -fuzztime=$(FUZZEXECS)x ./redirect
	$(GO) test -run=x -fuzz=FuzzParseSteered -fuzztime=$(FUZZEXECS)x ./redirect
	$(GO) test -run=x -fuzz=FuzzApply -fuzztime=$(FUZZEXECS)x ./kernelmodes/iptables
	$(GO) test -run=x -fuzz=FuzzWatchMessages -fuzztime=$(FUZZEXECS)x ./netfilter
	$(GO) test -run=x -fuzz=FuzzDecode -fuzztime=$(FUZZEXECS)x ./netfilter/nftable
	$(GO) test -run=x -fuzz=FuzzPlan -fuzztime=$(FUZZEXECS)x ./netfilter/nftable
	$(GO) test -run=x -fuzz=FuzzCountCPUList -fuzztime=$(FUZZEXECS)x ./cmd/svcproxy

# What each command needs, as program (or absolute path):Debian package.
RUN_TOOLS  := ip:iproute2 iptables:iptables iptables-restore:iptables ipset:ipset
TEST_TOOLS := $(RUN_TOOLS) ping:iputils-ping conntrack:conntrack dig:dnsutils dnsmasq:dnsmasq-base \
	unshare:util-linux mount:mount qemu-system-x86_64:qemu-system-x86 nft:nftables
BENCH_TOOLS := $(TEST_TOOLS) wrk:wrk iperf3:iperf3 haproxy:haproxy nginx:nginx dnsperf:dnsperf \
	/usr/lib/nginx/modules/ngx_stream_module.so:libnginx-mod-stream

# $(call install,TOOLS,ROOTLESS): install the packages of the missing
# programs with apt-get (apt-get update first), only when one is missing, so
# running it again costs nothing. Not root: ROOTLESS says what follows
# (fail, or warn and go on).
define install
	@missing=; for pair in $(1); do \
		need=$${pair%%:*}; case $$need in \
		/*) [ -e "$$need" ] ;; \
		*) PATH="$$PATH:/usr/sbin:/sbin" command -v "$$need" >/dev/null 2>&1 ;; \
		esac || missing="$$missing $${pair#*:}"; \
	done; \
	missing=$$(printf '%s\n' $$missing | sort -u | tr '\n' ' '); \
	if [ -z "$${missing# }" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
		if [ "$(2)" = warn ]; then echo "make: not root, and missing Debian packages: $$missing: the namespace tests will skip (run as root: sudo make test)"; exit 0; fi; \
		echo "make: missing Debian packages: $$missing: run as root (sudo make $@) to install them"; exit 1; \
	fi; \
	if ! command -v apt-get >/dev/null 2>&1; then echo "make: not Debian: install the packages $$missing (or their equivalents), then run this again"; exit 1; fi; \
	echo "make: installing $$missing"; \
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing
endef

run-deps:
	$(call install,$(RUN_TOOLS),fail)

test-deps:
	$(call install,$(TEST_TOOLS),warn)

# Everything the tests and the benchmarks use (run as root).
deps:
	$(call install,$(BENCH_TOOLS),fail)

clean:
	rm -rf $(BIN)
