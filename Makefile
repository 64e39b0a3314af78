# strata: build, demo, tests. `make demo` and `make test` are all a fresh clone needs.
GO      ?= go
PYTHON  ?= python3
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# Each plugin is a library (plugins/NAME) and a one-line main
# (cmd/strata-plugin-NAME), so `go install ./cmd/...` names its binary as
# discovery expects.
PLUGINS := $(patsubst cmd/strata-plugin-%,%,$(wildcard cmd/strata-plugin-*))
TESTENV := .venv/test
GENENV  := .venv/gen
TOOLENV := .venv/tools
BENCHENV := .venv/bench
BENCHORTENV := .venv/bench-ort
CLIENTENV := .venv/client

.PHONY: all build install man demo test test-go test-conformance test-client test-outoftree test-python test-go-install lint fuzz fixtures proto bench bench-convert bench-torch bench-ort bench-ort-smoke bench-dequant clean

all: build

# The host and every plugin, into bin/ (plugins are found next to strata).
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/strata ./cmd/strata
	$(GO) build -o bin/strata-headeronly ./cmd/strata-headeronly
	$(GO) build -o bin/strata-transformcases ./internal/cmd/transformcases
	$(GO) build -o bin/strata-routercases ./internal/cmd/routercases
	$(GO) build -o bin/probe/strata-plugin-llama ./internal/probeplugin
	@for p in $(PLUGINS); do echo "$(GO) build -o bin/strata-plugin-$$p ./cmd/strata-plugin-$$p"; \
		$(GO) build -o bin/strata-plugin-$$p ./cmd/strata-plugin-$$p || exit 1; done

# strata and every plugin into PREFIX/bin, side by side as discovery expects
# (what `go install ./cmd/...` puts in GOBIN).
PREFIX ?= /usr/local
install:
	GOBIN=$(abspath $(PREFIX)/bin) $(GO) install -ldflags "$(LDFLAGS)" ./cmd/strata $(addprefix ./cmd/strata-plugin-,$(PLUGINS))

# docs/strata.1, the man page made from the commands and flags (a test
# fails while the committed page is not the current one).
man:
	$(GO) run ./cmd/strata man > docs/strata.1.new && mv docs/strata.1.new docs/strata.1

# Export the tiny Llama in examples/, greedy-decode it with ONNX Runtime,
# compare with transformers.
demo: build $(TESTENV)/.installed
	$(TESTENV)/bin/python examples/demo.py

# Export header-only checkpoints of real releases (bench/configs) whole,
# layerwise and with layer functions, and one architecture at 8/32/128
# layers; prints Markdown tables and writes bench/results.json; then
# bench-convert's table (strata convert against cp).
bench: build
	$(GO) run ./internal/cmd/bench --strata bin/strata --json bench/results.json
	$(GO) run ./internal/cmd/benchconvert --strata bin/strata --json bench/convert-results.json

# strata convert on a multi-GB bf16 checkpoint with real data (about 20 GB
# of scratch disk, a few minutes): as stored, fp8-block and fp8-dynamic, timed
# against cp of the same directory; peak RSS at 4 and 16 layers.
bench-convert: build
	$(GO) run ./internal/cmd/benchconvert --strata bin/strata --json bench/convert-results.json

# strata's exports (default, --subfunctions, --target ort) against the ONNX
# Runtime GenAI model builder's, as ONNX Runtime serves them: session
# creation and peak RSS, prefill and decode at 128 and 1,024 tokens, greedy
# tokens against transformers, onnxruntime-genai tokens/s; a random 178M Llama
# in float32 and bfloat16 (its own environment). bench-ort-smoke: the same
# harness on a 2-layer Llama (under a minute), kept out of `make test` (torch).
bench-ort: build $(BENCHORTENV)/.installed
	$(BENCHORTENV)/bin/python bench/ort/compare.py --json bench/ort/results.json

bench-ort-smoke: build $(BENCHORTENV)/.installed
	$(BENCHORTENV)/bin/python bench/ort/smoke.py

# Which dequantisation form of quantised weights (FP8, int4, NVFP4) ONNX
# Runtime opens fastest and leanest, on a Llama-8B layer (about 10 minutes,
# ~1.5 GB of scratch data; the test environment): docs/compile.md.
bench-dequant: $(TESTENV)/.installed
	$(TESTENV)/bin/python bench/dequant/compare.py --json bench/dequant/results.json

$(BENCHORTENV)/.installed: bench/ort/requirements.txt
	$(PYTHON) -m venv $(BENCHORTENV)
	$(BENCHORTENV)/bin/pip install -q --disable-pip-version-check -r bench/ort/requirements.txt
	touch $@

# strata against torch.onnx.export on a mid-size random Llama (a few minutes,
# ~5 GB of RAM; torch in its own environment).
bench-torch: build $(BENCHENV)/.installed
	$(BENCHENV)/bin/python bench/torch/compare.py --json bench/torch/results.json

$(BENCHENV)/.installed: bench/torch/requirements.txt
	$(PYTHON) -m venv $(BENCHENV)
	$(BENCHENV)/bin/pip install -q --disable-pip-version-check -r $<
	touch $@

# Everything CI runs: lint, Go tests, a short fuzz run of every parser, the
# conformance suite against ONNX Runtime, the real clients of `strata
# convert` output, the out-of-tree plugin example, and the two installs
# (pip's wheel with the Python API, go install's binaries).
test: lint test-go fuzz test-conformance test-client test-outoftree test-python test-go-install

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# -race: the exporter runs windows in parallel and the host talks to plugins
# from several goroutines.
test-go:
	$(GO) test -race ./...

# Go fuzz targets of every parser of untrusted input (package:target), each
# run for FUZZTIME from its committed seed corpus (testdata/fuzz/<target>).
# A failure leaves the input in testdata/fuzz: fix it, and commit the input
# as its regression case. Longer: make fuzz FUZZTIME=2000000x.
# A count, not a duration: Go 1.26's coordinator can report a bare "context
# deadline exceeded" when a duration ends mid-exec (golang/go#75804, fixed in
# 1.27); a count has no deadline to race. 20000 execs is ~5-15 s a target here.
FUZZTIME ?= 20000x
FUZZ := host/checkpoint:FuzzSafetensorsHeader host/checkpoint:FuzzIndex host/checkpoint:FuzzConfig \
	host/checkpoint:FuzzBinPickle host/weights:FuzzSpec host/window:FuzzManifest host/quant:FuzzRead
fuzz:
	@for t in $(FUZZ); do pkg=$${t%%:*}; name=$${t##*:}; \
		echo "$(GO) test ./$$pkg -run '^$$name$$' -fuzz '^$$name$$' -fuzztime $(FUZZTIME)"; \
		$(GO) test ./$$pkg -run "^$$name\$$" -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) || exit 1; done

test-conformance: build $(TESTENV)/.installed
	cd conformance && ../$(TESTENV)/bin/python -m pytest -q -rA --ignore=client

# strata convert's output loaded by transformers (FineGrainedFP8 with
# accelerate, compressed-tensors), torch on CPU, in its own environment.
test-client: build $(CLIENTENV)/.installed
	cd conformance && ../$(CLIENTENV)/bin/python -m pytest -q -rA client

# examples/plugin-outoftree, as a third party builds it: its own module
# (go.mod replaces github.com/strata-llm/strata with this checkout), vetted,
# tested (sdk/plugintest, sdk/refeval), built into a directory strata does
# not search by itself, and checked against transformers' logits through
# --plugin-dir (conformance/check_plugin.py; docs/plugins.md).
OUTOFTREE := examples/plugin-outoftree
test-outoftree: build $(TESTENV)/.installed
	cd $(OUTOFTREE) && $(GO) vet ./... && $(GO) test ./... && $(GO) build -o $(CURDIR)/bin/outoftree/strata-plugin-qwen2 .
	$(TESTENV)/bin/python conformance/check_plugin.py check $(OUTOFTREE)/testdata/tiny-qwen2/model \
		--reference $(OUTOFTREE)/testdata/tiny-qwen2/reference.npz --plugin-dir bin/outoftree --layerwise

# pip install as a user does it: the wheel (Go binaries built by its hook)
# into a fresh virtualenv, then the Python API tests and the README's
# notebook example there (python/tests).
test-python: $(TESTENV)/.installed
	rm -rf bin/wheel bin/wheel-venv
	$(TESTENV)/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w bin/wheel .
	$(PYTHON) -m venv bin/wheel-venv
	bin/wheel-venv/bin/pip install -q --disable-pip-version-check bin/wheel/strata_onnx-*.whl -r python/requirements-test.txt
	cd python/tests && ../../bin/wheel-venv/bin/python -m pytest -q -rA -p no:cacheprovider .

# go install ./... into an empty GOBIN: strata finds every plugin next to
# itself and exports fixtures that reproduce transformers.
test-go-install: $(TESTENV)/.installed
	rm -rf bin/gobin
	GOBIN=$(CURDIR)/bin/gobin $(GO) install ./...
	cd python/tests && STRATA_TEST_BIN=$(CURDIR)/bin/gobin ../../$(TESTENV)/bin/python -m pytest -q -rA -p no:cacheprovider test_installed.py

$(CLIENTENV)/.installed: conformance/requirements-client.txt
	$(PYTHON) -m venv $(CLIENTENV)
	$(CLIENTENV)/bin/pip install -q --disable-pip-version-check -r $<
	touch $@

$(TESTENV)/.installed: conformance/requirements-test.txt
	$(PYTHON) -m venv $(TESTENV)
	$(TESTENV)/bin/pip install -q --disable-pip-version-check -r $<
	touch $@

# Regenerate the conformance fixtures and the demo model with transformers.
fixtures: $(GENENV)/.installed
	cd conformance && ../$(GENENV)/bin/python generate.py

# Regenerate the SDK's transformers reference values (sdk/blocks/testdata).
.PHONY: sdk-fixtures
sdk-fixtures: $(GENENV)/.installed
	$(GENENV)/bin/python sdk/blocks/testdata/gen_rope.py

$(GENENV)/.installed: conformance/requirements-gen.txt
	$(PYTHON) -m venv $(GENENV)
	$(GENENV)/bin/pip install -q --disable-pip-version-check -r $<
	touch $@

# Regenerate sdk/onnx and sdk/proto Go code from the .proto files.
proto: $(TOOLENV)/.installed
	sdk/proto/generate.sh

$(TOOLENV)/.installed:
	$(PYTHON) -m venv $(TOOLENV)
	$(TOOLENV)/bin/pip install -q --disable-pip-version-check grpcio-tools==1.85.1
	GOBIN=$(CURDIR)/$(TOOLENV)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(CURDIR)/$(TOOLENV)/bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	touch $@

clean:
	rm -rf bin out
