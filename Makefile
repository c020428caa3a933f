# Two commands do all the set-up: `make demo` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
NSYS_VERSION ?= 2023.4
DEMO_OUT ?= demo-output

.PHONY: setup nsys nsys-2024 nsys-recipes-env browser demo test lint lab clean bench bench-huge bench-ranks

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[test,samples]'
	touch $@

# Bytecode for the pack's own modules (an editable install has none, and none is written where
# PYTHONDONTWRITEBYTECODE is set, as in many containers): every command would compile them again.
setup: $(STAMP)
	@$(BIN)/python -m compileall -q src recipes >/dev/null

# Fetch Nsight Systems (with the host side, needed by `nsys stats` and to make reports) unless one is found.
nsys: setup
	@$(BIN)/nsys-recipe doctor >/dev/null 2>&1 && $(BIN)/nsys-recipe doctor | head -3 \
	  || $(BIN)/nsys-recipe setup-nsys --version $(NSYS_VERSION) --with-host

# The shipped H100 job: its reports come with their exports, so no Nsight Systems is needed.
demo: setup
	$(BIN)/nsys-recipe run --name straggler_heatmap sample_reports/h100_gloo_8rank \
	  --output $(DEMO_OUT)/straggler_heatmap --force-overwrite --report

lint: setup
	$(BIN)/ruff check src tests recipes scripts bench notebooks

# The end-to-end tests also run under Nsight Systems 2024.2 (analysis side only) and compare tables.
nsys-2024: setup
	$(BIN)/nsys-recipe setup-nsys --version 2024.2 >/dev/null

# Nsight Systems 2024.2's own recipes fail under pandas 3 and NumPy 2 (nccl_gpu_overlap_trace, the oracle of
# comm_overlap's tests, among them): they run with the releases they were written for, in a Python of their own.
RECIPES_VENV ?= .venv-nsys-recipes
$(RECIPES_VENV)/.installed-stamp:
	$(PY) -m venv $(RECIPES_VENV)
	$(RECIPES_VENV)/bin/pip install -q 'pandas==2.2.3' 'numpy<2' 'pyarrow<18' psutil
	touch $@

nsys-recipes-env: $(RECIPES_VENV)/.installed-stamp

# Debian's Chromium, for the test that opens every generated HTML headless with no network.
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

test: nsys nsys-2024 nsys-recipes-env browser lint
	$(BIN)/python -m pytest -q

# The pack against Nsight Systems' built-in recipes, scale and Dask runs: writes bench/RESULTS.md (not a test).
bench: nsys
	$(BIN)/python bench/bench.py $(BENCH_ARGS)

# One long capture per rank (real reports replicated to 680 MB and 5.4 GB, and a SYNTHETIC rank of 330 MB to
# 5.3 GB): the recipes against the floor (just reading what each needs) and against the built-ins; writes the
# "huge reports" section of bench/RESULTS.md.
bench-huge: nsys
	$(BIN)/python bench/huge.py $(HUGE_ARGS)

# SYNTHETIC 1,024, 4,096 and 10,000 ranks x 1,000 iterations, straggler_heatmap --report through a Dask scheduler and
# two workers on 127.0.0.1: writes the "thousands of ranks" section of bench/RESULTS.md (the sets take 16 GB at most,
# one at a time with RANKS_ARGS="--drop-sets").
bench-ranks: setup
	$(BIN)/python bench/ranks.py $(RANKS_ARGS)

# JupyterLab on an output folder (default: the demo's): its notebooks run against the Parquet beside them.
# As root (containers) it passes --allow-root; LAB_ARGS go to jupyter lab as they are, for example
# LAB_ARGS="--no-browser --ip=0.0.0.0 --port=8888".
LAB_DIR ?= $(DEMO_OUT)
LAB_ARGS ?=
lab: setup
	$(BIN)/pip install -q 'jupyterlab>=4'
	$(BIN)/jupyter lab --notebook-dir=$(LAB_DIR) $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:
	rm -rf $(VENV) $(RECIPES_VENV) $(DEMO_OUT) build dist .pytest_cache test-artifacts
