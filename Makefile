# The project's build and test entry points; .ci/run calls `make test`.

# Built tools are cached outside the checkout so they survive between runs.
LAB_CACHE ?= /var/cache/kubectl-migrate-lab
KUBECTL   := $(LAB_CACHE)/bin/kubectl

.PHONY: build lint test services-up services-down

build:
	CGO_ENABLED=0 go build -o bin/ ./cmd/...

lint:
	@files=$$(gofmt -l . test/kubectl); if [ -n "$$files" ]; then echo "not gofmt-ed (run gofmt -w .):"; echo "$$files"; exit 1; fi
	go vet ./...

# Upstream kubectl, built from the module proxy, to test the plugin through
# kubectl's real plugin mechanism.
$(KUBECTL):
	cd test/kubectl && CGO_ENABLED=0 go build -o $(KUBECTL) .

# Unit tests, and integration tests against a real RabbitMQ, a real registry
# and the real kubectl (test/services.sh starts the services on loopback).
test: lint $(KUBECTL)
	eval "$$(bash test/services.sh up)" && \
	MIGRATE_TEST_KUBECTL=$(KUBECTL) go test -race -count=1 ./...

services-up:
	@bash test/services.sh up

services-down:
	@bash test/services.sh down
