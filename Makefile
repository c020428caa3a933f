# Two commands do all the set-up: `make demo` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
NSYS_VERSION ?= 2023.4
DEMO_OUT ?= demo-output

.PHONY: setup nsys nsys-2024 demo test lint lab clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

setup: $(STAMP)

# Fetch Nsight Systems (with the host side, needed by `nsys stats` and to make reports) unless one is found.
nsys: setup
	@$(BIN)/nsys-recipe doctor >/dev/null 2>&1 && $(BIN)/nsys-recipe doctor | head -3 \
	  || $(BIN)/nsys-recipe setup-nsys --version $(NSYS_VERSION) --with-host

demo: nsys
	$(BIN)/nsys-recipe run --name straggler_heatmap sample_reports/cpu_ddp \
	  --output $(DEMO_OUT)/straggler_heatmap --force-overwrite --report

lint: setup
	$(BIN)/ruff check src tests recipes scripts

# The end-to-end tests also run under Nsight Systems 2024.2 (analysis side only) and compare tables.
nsys-2024: setup
	$(BIN)/nsys-recipe setup-nsys --version 2024.2 >/dev/null

test: nsys nsys-2024 lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_OUT) build dist .pytest_cache
