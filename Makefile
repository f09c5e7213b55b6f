# Rialto — one module, one binary. bench/ is a module of its own (its
# dependencies, e.g. ZeroMQ for a peer, are not the product's): `./...` here
# does not include it; `make check` and `make bench-test` cover it.
GO      ?= go
PKGS    ?= ./...
BIN     ?= bin/rialto

.PHONY: build test check bench bench-quick bench-test soak fuzz clean

build:
	$(GO) build -o $(BIN) ./cmd/rialto

# The test command of the README and of .ci/run.
test:
	$(GO) test -race -timeout 14m $(PKGS)

check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@latest
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck $(PKGS)
	cd bench && $(GO) vet ./... && PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck ./...

# The bench module's own tests (its harness and peers' baselines).
bench-test:
	cd bench && $(GO) test -race -timeout 10m ./...

# Benchmarks against peers, side by side, Rialto through leases of
# `rialto agent` processes (bin/rialto); writes docs/BENCHMARKS.md.
# BENCH_AREAS="block pgbench" limits the areas; REPS etc. per area script.
# `make bench-quick` (bench/run.sh --quick): 3 rounds, shorter runs; the
# generated file says which mode made it.
bench: build
	bash bench/run.sh

bench-quick: build
	bash bench/run.sh --quick

# Long-running soak tests (not part of make test).
soak:
	RIALTO_SOAK=1 $(GO) test -race -timeout 60m -run Soak $(PKGS)

# Short fuzzing pass over every fuzz target (FUZZTIME per target).
FUZZTIME ?= 20s
fuzz:
	bash bench/fuzz.sh $(FUZZTIME)

clean:
	rm -rf bin
