# Rialto — one module, one binary.
GO      ?= go
PKGS    ?= ./...
BIN     ?= bin/rialto

.PHONY: build test check bench soak fuzz clean

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

# Benchmarks against peers, side by side; writes docs/BENCHMARKS.md.
bench: build
	bash bench/run.sh

# Long-running soak tests (not part of make test).
soak:
	RIALTO_SOAK=1 $(GO) test -race -timeout 60m -run Soak $(PKGS)

# Short fuzzing pass over every fuzz target (FUZZTIME per target).
FUZZTIME ?= 20s
fuzz:
	bash bench/fuzz.sh $(FUZZTIME)

clean:
	rm -rf bin
