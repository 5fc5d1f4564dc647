# The README's two commands: `make demo` and `make test`. Each sets up everything it needs by itself.
VENV    ?= .venv
PY      := $(VENV)/bin/python
SUITE   := $(VENV)/bin/suite
PYTEST_ARGS ?=

.PHONY: setup model demo test test-fast lint bench-cuda bench-rocm clean

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

bench-cuda: setup
	$(SUITE) build matrices/gemma4.yaml
	$(SUITE) run matrices/gemma4.yaml

bench-rocm: setup
	$(SUITE) build matrices/glm52-aiter-router-mi355x.yaml
	$(SUITE) run matrices/glm52-aiter-router-mi355x.yaml
	$(SUITE) build matrices/qwen38-fse-mi355x.yaml
	$(SUITE) run matrices/qwen38-fse-mi355x.yaml

clean:
	rm -rf runs .cache .pytest_cache
