# The project's build and test entry points; .ci/run calls `make test`.

# Built tools are cached outside the checkout so they survive between runs.
LAB_CACHE ?= /var/cache/kubectl-migrate-lab
KUBECTL   := $(LAB_CACHE)/bin/kubectl

.PHONY: build lint unit e2e crash-matrix test demo lab-up lab-down services-up services-down release-check krew-manifest

build:
	CGO_ENABLED=0 go build -o bin/ ./cmd/...

lint:
	@files=$$(gofmt -l . test/kubectl); if [ -n "$$files" ]; then echo "not gofmt-ed (run gofmt -w .):"; echo "$$files"; exit 1; fi
	go vet ./...
	go vet -tags e2e ./test/e2e

# Upstream kubectl, built from the module proxy, to test the plugin through
# kubectl's real plugin mechanism.
$(KUBECTL):
	cd test/kubectl && CGO_ENABLED=0 go build -o $(KUBECTL) .

# Unit tests, and integration tests against a real RabbitMQ, a real registry
# and the real kubectl (test/services.sh starts the services on loopback).
unit: lint $(KUBECTL)
	eval "$$(bash test/services.sh up)" && \
	MIGRATE_TEST_KUBECTL=$(KUBECTL) go test -race -count=1 ./...

# End-to-end: live pods migrated on the lab's real two-node cluster.
e2e:
	go run ./test/lab up
	eval "$$(go run ./test/lab env)" && go test -tags e2e -count=1 -v -timeout 30m ./test/e2e

# Every step of every strategy and mode: the plugin SIGKILLed as each phase
# starts, then recovered (e2e runs a chosen few of them).
crash-matrix:
	go run ./test/lab up
	eval "$$(go run ./test/lab env)" && E2E_CRASH_MATRIX=all go test -tags e2e -count=1 -v -timeout 90m -run 'TestRecover' ./test/e2e

# The release, offline: goreleaser check and a full local release (six
# archives, checksums, the multi-arch agent image to the loopback registry,
# the krew manifest), krew's validator, and a krew install of the archive
# through which kubectl migrate version and completion must work.
release-check: $(KUBECTL)
	eval "$$(bash test/services.sh up)" && \
	KUBECTL=$(KUBECTL) RELEASE_TOOLS=$(LAB_CACHE)/tools bash test/release/check.sh

# Regenerates krew/migrate.yaml after the krews section of .goreleaser.yaml changed.
krew-manifest: $(KUBECTL)
	eval "$$(bash test/services.sh up)" && \
	KUBECTL=$(KUBECTL) RELEASE_TOOLS=$(LAB_CACHE)/tools KREW_MANIFEST_OUT=$(CURDIR)/krew/migrate.yaml bash test/release/check.sh

# Everything; needs root (the lab). Stop the lab afterwards with make lab-down.
test: unit release-check e2e

demo:
	go run ./test/lab demo

lab-up:
	go run ./test/lab up

lab-down:
	go run ./test/lab down

services-up:
	@bash test/services.sh up

services-down:
	@bash test/services.sh down
