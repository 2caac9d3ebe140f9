# The project's build and test entry points; .ci/run calls `make test`.

# Built tools are cached outside the checkout so they survive between runs.
LAB_CACHE ?= /var/cache/kubectl-migrate-lab
KUBECTL   := $(LAB_CACHE)/bin/kubectl

# Every build, vet and test compiles with -trimpath, as the lab, its images
# and the release do, so they all share one compile of the dependencies
# (cold, each compile of client-go and its tree costs minutes).
export GOFLAGS += -trimpath

.PHONY: help build lint unit integration e2e e2e-containerd e2e-containerd24 bench-restore bench-size bench-lazy bench-anypod eval-quick bench eval eval-figures slow-faults lazy-probe soak crash-matrix test demo bench-transfer lab-up lab-down services-up services-down release-check krew-manifest python-image

# The linter, pinned, installed from the module proxy into GOPATH's bin
# under a versioned name, so every clone on a machine shares one build.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(shell go env GOPATH)/bin/staticcheck-$(STATICCHECK_VERSION)

help: ## this list
	@awk -F ':.*## ' '/^[a-z0-9-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## the plugin, the agent and the sample workload into bin/
	CGO_ENABLED=0 go build -o bin/ ./cmd/...

$(STATICCHECK):
	tmp=$$(mktemp -d) && GOBIN=$$tmp go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) && mkdir -p $(@D) && mv $$tmp/staticcheck $@ && rmdir $$tmp

# vet and staticcheck compile the dependencies without cgo, as every build
# does (the lab's, the images', the release's): one compile serves them all.
lint: $(STATICCHECK) ## gofmt, go vet, staticcheck, and no binary or file over 1 MB tracked
	bash test/lint/tracked.sh
	@files=$$(gofmt -l . test/kubectl); if [ -n "$$files" ]; then echo "not gofmt-ed (run gofmt -w .):"; echo "$$files"; exit 1; fi
	CGO_ENABLED=0 go vet ./...
	CGO_ENABLED=0 go vet -tags e2e ./test/e2e
	CGO_ENABLED=0 $(STATICCHECK) ./...
	CGO_ENABLED=0 $(STATICCHECK) -tags e2e ./test/e2e

# Upstream kubectl, built from the module proxy, to test the plugin through
# kubectl's real plugin mechanism.
$(KUBECTL):
	cd test/kubectl && CGO_ENABLED=0 go build -o $(KUBECTL) . # as test/lab builds it, so its build is a cache hit

unit: ## unit tests: no root, no services (the integration tests skip themselves)
	go test -short -race -parallel 4 ./...

# Unit tests, and integration tests against a real RabbitMQ, a real registry
# and the real kubectl (test/services.sh starts the services on loopback).
integration: lint $(KUBECTL) ## unit and integration tests (real RabbitMQ, registry, kubectl; installs them)
	eval "$$(bash test/services.sh up)" && \
	MIGRATE_TEST_KUBECTL=$(KUBECTL) go test -race -count=1 -parallel 4 ./...

# The whole crash matrix runs here. Its cases and every test that keeps to
# namespaces of its own (concurrent in test/e2e/lab_test.go) run E2E_PARALLEL
# at a time, after the tests that change the lab for everyone, one by one.
E2E_PARALLEL ?= 4
e2e: ## live pods migrated on the lab's real two-node cluster, with the whole crash matrix (root)
	go run ./test/lab up
	eval "$$(go run ./test/lab env)" && E2E_CRASH_MATRIX=all go test -tags e2e -count=1 -v -parallel $(E2E_PARALLEL) -timeout 70m ./test/e2e

# The core of e2e again on containerd nodes (2.3.7, restore opted in), and
# the opt-in itself: a node left at containerd's default is refused, then
# works once the setting is on; and the fence, which finds a pod's network
# namespace in each runtime's own way. The lab is brought down and up again
# with LAB_RUNTIME=containerd, and left down.
E2E_CONTAINERD := ^(TestMS2MMigratesALivePod|TestACheckpointSentDirectRunsOnlyInItsPod|TestACheckpointInAPrivateRegistryRunsOnlyInItsPod|TestStopAndCopyMigratesALivePod|TestStatefulSetSequential|TestFailedMigrationRollsBack|TestCheckPasses|TestCheckUnpullableAgentImage|TestRestoreOptIn|TestAFenceCutsAPodOffAndOutlivesItsCheckpoint)$$
e2e-containerd: ## the core e2e and the restore opt-in on the containerd lane (root)
	go run ./test/lab down
	LAB_RUNTIME=containerd go run ./test/lab up
	eval "$$(go run ./test/lab env)" && go test -tags e2e -count=1 -v -parallel $(E2E_PARALLEL) -timeout 30m -run '$(E2E_CONTAINERD)' ./test/e2e
	go run ./test/lab down

# containerd 2.4 (no CRI restore): check and preflight name node-setup;
# after it, migrations restore through the kubectl-migrate runtime; after
# --uninstall the nodes are as before. Brought up with
# LAB_RUNTIME=containerd-2.4 and left down.
E2E_CONTAINERD24 := ^(TestTheRuntimeRestoresWhereContainerdCannot|TestLazyPages|TestRuntimeRestore|TestEveryMoveThroughTheRuntime|TestTenantCannotClaimAStagedCheckpoint|TestTenantCannotSteerAnotherNamespacesConsumer|TestTenantCannotSteerARecoveryByItsJournal|TestTenantCannotOwnTheAgentsNamespace|TestTenantAgentsActOnlyWhereTheirRequesterMigrates|TestCheckpointRestoreMovesAProcessWithoutTheContract|TestCheckpointRestoreRollsBackAProcessWithoutTheContract|TestCheckpointRestoreMovesRedis|TestCheckpointRestoreMovesRedisWithItsEmptyDir|TestCheckpointRestoreMovesARedisStatefulSet|TestRecoverRedisStatefulSetAfterCrash|TestCheckpointRestoreMovesARedisDeployment|TestCheckpointRestoreMovesAConsumerWithoutTheContract)$$
e2e-containerd24: ## the runtime-level restore on containerd 2.4 nodes (root)
	go run ./test/lab down
	LAB_RUNTIME=containerd-2.4 go run ./test/lab up
	eval "$$(go run ./test/lab env)" && go test -tags e2e -count=1 -v -parallel $(E2E_PARALLEL) -timeout 45m -run '$(E2E_CONTAINERD24)' ./test/e2e
	go run ./test/lab down

# The lab benchmarks (not timed tests): strategies at 4, 10 and 16 msg/s,
# StatefulSet modes, state size; medians into the generated
# docs/bench/lab.txt (docs/performance.md says how to read it), the whole
# log beside it in bin/ (ignored).
bench: ## the lab benchmarks: strategies, StatefulSet modes, state size, into docs/bench/lab.txt (lab, ~30 min)
	go run ./test/lab up
	mkdir -p bin docs/bench
	(eval "$$(go run ./test/lab env)" && go test -tags e2e -run '^$$' -bench '$(BENCH)' -benchtime 1x -timeout 90m -v ./test/e2e 2>&1; echo $$? > bin/bench.rc) | tee bin/bench.log; exit $$(cat bin/bench.rc)
	{ echo "# make bench, $$(date -u +%Y-%m-%d), commit $$(git rev-parse --short HEAD), $$(nproc) CPUs; medians in ms unless the name says ratio"; \
	  awk -f test/bench/distil.awk bin/bench.log; } > docs/bench/lab.txt
	cat docs/bench/lab.txt
BENCH ?= .

# lab-bench NAME,REGEX,TIMEOUT,FILE: brings the lab up, runs the lab
# benchmarks matching REGEX once (each loops its own rounds), keeps the whole
# log in bin/NAME.log (ignored) and distils the medians into the generated
# FILE, headed by the command, date, commit, CPUs and runtime.
define lab-bench
	go run ./test/lab up
	mkdir -p bin docs/bench
	(eval "$$(go run ./test/lab env)" && go test -tags e2e -run '^$$' -bench '$(2)' -benchtime 1x -timeout $(3) -v ./test/e2e 2>&1; echo $$? > bin/$(1).rc) | tee bin/$(1).log; exit $$(cat bin/$(1).rc)
	{ echo "# make $(1), $$(date -u +%Y-%m-%d), commit $$(git rev-parse --short HEAD), $$(nproc) CPUs, $$(go run ./test/lab env | sed -n 's/^export LAB_RUNTIME=//p')$${E2E_EVAL_RUNS:+, E2E_EVAL_RUNS=$$E2E_EVAL_RUNS}$${E2E_SIZES:+, E2E_SIZES=$$E2E_SIZES}; medians in ms unless the name says ratio"; \
	  awk -f test/bench/distil.awk bin/$(1).log; } > $(4)
	cat $(4)
endef

# The restore through the container runtime (registry, direct) beside the
# kubectl-migrate runtime's, MS2M and stop-and-copy at 10 msg/s, medians of
# 5 alternated rounds (CRI-O lane; node-setup installs and removes the
# runtime); a generated file.
bench-restore: ## the restore paths side by side, into docs/bench/restore-paths.txt (lab, ~15 min)
	$(call lab-bench,bench-restore,RestorePaths,60m,docs/bench/restore-paths.txt)

# The kubectl-migrate runtime's restore of 512 MiB of state beside the
# container runtime's, against a plain node-to-node file copy plus the
# restore itself, medians of 5 alternated rounds (CRI-O lane); a generated
# file.
bench-size: ## 512 MiB restored through each path, into docs/bench/restore-at-size.txt (lab, ~30 min)
	$(call lab-bench,bench-size,RestoreAtSize,90m,docs/bench/restore-at-size.txt)

# Lazy pages against eager ones, stop-and-copy of a consumer under the
# kubectl-migrate runtime holding 64 MiB, 512 MiB and 2 GiB, medians of
# E2E_EVAL_RUNS alternated rounds (CRI-O lane); a generated file.
bench-lazy: ## 64 MiB, 512 MiB and 2 GiB moved with stop-and-copy and MS2M, eager and lazy pages, into docs/bench/lazy-pages.txt (lab, ~80 min; E2E_EVAL_RUNS=3 ~50)
	$(call lab-bench,bench-lazy,LazyPages,120m,docs/bench/lazy-pages.txt)

# The freeze of a pod without the MS2M contract (checkpoint/restore):
# Debian's redis-server idle and holding 256 MiB, through the container
# runtime's restore and the kubectl-migrate runtime's, medians of 5
# alternated rounds (CRI-O lane); a generated file.
bench-anypod: ## Redis idle and holding 256 MiB moved with checkpoint/restore through each path, into docs/bench/any-pod-freeze.txt (lab, ~15 min)
	$(call lab-bench,bench-anypod,AnyPodFreeze,60m,docs/bench/any-pod-freeze.txt)

# The direct transfer's stream (TLS) beside a plain file → TCP → file copy,
# 512 MiB over loopback, alternated, three times; a generated file.
bench-transfer: ## the direct transfer against a plain copy, into docs/bench/direct-transfer.txt (no lab, ~1 min)
	mkdir -p docs/bench
	{ echo "# make bench-transfer, $$(date -u +%Y-%m-%d), commit $$(git rev-parse --short HEAD), $$(nproc) CPUs"; \
	  go test -run '^$$' -bench DirectTransfer -benchtime 5x -count 3 ./pkg/agent | grep -E 'ns/op|^(goos|goarch|cpu):' | sed -E 's/^\s+/BenchmarkDirectTransfer-N  /'; } > docs/bench/direct-transfer.txt
	cat docs/bench/direct-transfer.txt

# Faults from outside that take long to inject (a broker restart), beside the
# ones e2e runs (registry gone, target deleted or killed, source killed).
# Issue 42's first question, asked of the lab without Kubernetes: can its
# CRIU and kernel restore with lazy pages? CRIU's page server needs pipes
# larger than fs.pipe-max-size lets a process without CAP_SYS_RESOURCE
# have (this machine drops that capability), so the probe raises the limit
# for its run and puts it back.
LAZY_MIB ?= 256
lazy-probe: ## a process of LAZY_MIB MiB moved with CRIU's lazy pages on a lab node, no Kubernetes (lab)
	go run ./test/lab up
	@old=$$(cat /proc/sys/fs/pipe-max-size); echo 4194304 >/proc/sys/fs/pipe-max-size; \
	eval "$$(go run ./test/lab env)"; rc=0; \
	nsenter --net=/run/netns/klab-node-a --mount=$$LAB_RUN/node-a/ns/mnt -- sh -s $(LAZY_MIB) <test/lab/scripts/lazy-probe.sh || rc=$$?; \
	echo $$old >/proc/sys/fs/pipe-max-size; exit $$rc

slow-faults: ## the slow fault cases: RabbitMQ restarted during replay (lab)
	go run ./test/lab up
	eval "$$(go run ./test/lab env)" && E2E_SLOW_FAULTS=1 go test -tags e2e -count=1 -v -timeout 30m -run 'TestFault' ./test/e2e

# The paper's evaluation: every pod and StatefulSet strategy at 4, 10 and
# 16 msg/s and MS2M with and without the cutoff at 24 msg/s (above μ), runs
# interleaved, every run kept in docs/eval/runs.csv, then the figures and
# the summary there (generated files: never edited by hand).
EVAL_RUNS ?= 10
EVAL_DIR ?= $(CURDIR)/docs/eval
eval: ## the evaluation: EVAL_RUNS (default 10) runs per strategy and rate, docs/eval/runs.csv, figures and summary.md (lab; ~30 s a run)
	go run ./test/lab up
	eval "$$(go run ./test/lab env)" && E2E_EVAL_RUNS=$(EVAL_RUNS) E2E_EVAL_DIR=$(EVAL_DIR) go test -tags e2e -run '^$$' -bench Strategies -benchtime 1x -timeout 300m -v ./test/e2e
	$(MAKE) eval-figures

# The figures and summary again from the runs kept (no lab).
eval-figures: ## redraw docs/eval's figures and summary.md from its runs.csv
	go run ./test/eval -in $(EVAL_DIR)/runs.csv -out $(EVAL_DIR)

# The evaluation's quick mode, in .ci/run: one run each of the three pod
# strategies at 10 msg/s, then the figures; it fails unless the CSV has the
# three runs and every figure was drawn.
EVAL_QUICK_DIR ?= $(CURDIR)/eval-quick
eval-quick: ## one run per pod strategy at 10 msg/s, the CSV and the figures (lab, ~2 min)
	go run ./test/lab up
	rm -rf $(EVAL_QUICK_DIR)
	eval "$$(go run ./test/lab env)" && E2E_EVAL_QUICK=1 E2E_EVAL_RUNS=1 E2E_EVAL_DIR=$(EVAL_QUICK_DIR) go test -tags e2e -run '^$$' -bench Strategies -benchtime 1x -timeout 20m -v ./test/e2e
	go run ./test/eval -in $(EVAL_QUICK_DIR)/runs.csv -out $(EVAL_QUICK_DIR)
	test "$$(tail -n +2 $(EVAL_QUICK_DIR)/runs.csv | wc -l)" -eq 3
	for f in downtime total phases; do test -s $(EVAL_QUICK_DIR)/$$f.png && test -s $(EVAL_QUICK_DIR)/$$f.svg || exit 1; done
	test -s $(EVAL_QUICK_DIR)/summary.md

# 20 back-to-back migrations of one live consumer (and 4 of a StatefulSet
# pod); each run's figures in docs/soak/soak.csv, generated, never edited.
soak: ## 24 back-to-back migrations, conservation after each, counts back to baseline; docs/soak/soak.csv (lab, ~3 min)
	go run ./test/lab up
	mkdir -p docs/soak
	eval "$$(go run ./test/lab env)" && E2E_SOAK=1 E2E_SOAK_CSV=$(CURDIR)/docs/soak/soak.csv go test -tags e2e -count=1 -v -timeout 60m -run 'TestSoak' ./test/e2e

# Every step of every strategy and mode (and of lazy pages): the plugin SIGKILLed as each phase
# starts, then recovered; e2e runs it too. CRASH_RUNS repeats it, since
# races hide in single runs.
CRASH_RUNS ?= 1
crash-matrix: ## the plugin killed at every step of every mode, then recovered, CRASH_RUNS times (lab, ~5 min a run)
	go run ./test/lab up
	eval "$$(go run ./test/lab env)" && E2E_CRASH_MATRIX=all,lazy go test -tags e2e -count=$(CRASH_RUNS) -v -parallel $(E2E_PARALLEL) -timeout 90m -run 'TestRecover' ./test/e2e

# The release, offline: goreleaser check and a full local release (six
# archives, checksums, the multi-arch agent image to the loopback registry,
# the krew manifest), krew's validator, and the README's krew install line
# against the release's layout on loopback, through which kubectl
# live-migrate version, help and completion must work.
release-check: $(KUBECTL) ## goreleaser and krew, offline
	eval "$$(bash test/services.sh up)" && \
	KUBECTL=$(KUBECTL) RELEASE_TOOLS=$(LAB_CACHE)/tools bash test/release/check.sh

# Regenerates krew/live-migrate.yaml after the krews section of .goreleaser.yaml changed.
krew-manifest: $(KUBECTL)
	eval "$$(bash test/services.sh up)" && \
	KUBECTL=$(KUBECTL) RELEASE_TOOLS=$(LAB_CACHE)/tools KREW_MANIFEST_OUT=$(CURDIR)/krew/live-migrate.yaml bash test/release/check.sh

# Everything; needs root (the lab). Stop the lab afterwards with make lab-down.
# test/stages.sh runs integration, release-check, e2e, eval-quick,
# e2e-containerd and e2e-containerd24 in that order, the lab's builds beside
# the first two, and prints each stage's time.
test: ## everything .ci/run runs, each stage timed (root)
	bash test/stages.sh

# The Python consumer's image is Debian's python3 and pika, not a Go binary:
# ko cannot build it, so a release pushes it with this (root, debootstrap).
python-image: ## build examples/python's image as the lab runs it and push it to IMAGE=ref
	@test -n "$(IMAGE)" || { echo "give IMAGE=registry/repository:tag" >&2; exit 2; }
	go run ./test/lab python-image $(IMAGE)

demo: ## bring the lab up and migrate the sample workload
	go run ./test/lab demo

lab-up:
	go run ./test/lab up

lab-down:
	go run ./test/lab down

services-up:
	@bash test/services.sh up

services-down:
	@bash test/services.sh down
