# The README's commands. CMake does the building underneath.
#   make        build build/cairn (release)
#   make test   build with ASan+UBSan (clang) and run every test
#   make run    serve the bundled demo model on 127.0.0.1:8000
#   make fuzz   fuzz every parser longer, with random seeds
#   make test-agents  the real agent CLIs (Claude Code, Codex, OpenCode) against cairn serve
#   make test-cuda  on a machine with an NVIDIA GPU: a Release build with the CUDA backend in
#               build-cuda, then the GPU tests (ctest label cuda: tests/cuda/)
JOBS ?= $(shell nproc)
PORT ?= 8000

.PHONY: all build test test-cuda run fuzz clean bootstrap bootstrap-test bootstrap-agents test-agents

all: build

bootstrap:
	@scripts/bootstrap.sh build

bootstrap-test:
	@scripts/bootstrap.sh test

build: bootstrap
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j$(JOBS) --target cairn

test: bootstrap-test
	@CC=clang cmake -S . -B build-test -DCAIRN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build build-test -j$(JOBS)
	@cd build-test && ctest --output-on-failure -j$(JOBS)

bootstrap-agents:
	@scripts/bootstrap.sh agents

test-agents: bootstrap-agents
	@CC=clang cmake -S . -B build-test -DCAIRN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build build-test -j$(JOBS) --target cairn
	@CAIRN_SRC=$(CURDIR) CAIRN_BIN=$(CURDIR)/build-test/cairn ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 bash tests/agents/agents_cli.sh

test-cuda:
	@cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCAIRN_CUDA_TESTS=ON >/dev/null
	@cmake --build build-cuda -j$(JOBS)
	@cd build-cuda && ctest --output-on-failure -L cuda

run: build
	@scripts/run-demo.sh $(PORT)

fuzz: bootstrap-test
	@CC=clang cmake -S . -B build-test -DCAIRN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build build-test -j$(JOBS)
	@CAIRN_FUZZ_SECONDS=$${CAIRN_FUZZ_SECONDS:-120} CAIRN_FUZZ_SEED=0 \
	    sh -c 'for f in build-test/fuzz_*; do bash tests/fuzz/run.sh $$f $$(basename $$f) || exit 1; done'

clean:
	rm -rf build build-test
