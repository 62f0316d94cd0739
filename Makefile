# dlfs developer entry points. `make demo` and `make test` work on a fresh Debian machine as root.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test demo lint format bench bench-scale bench-pack bench-read clean

install: $(STAMP)

$(STAMP): pyproject.toml tools/install-deps.sh tools/build_pyfuse3.py
	tools/install-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python tools/build_pyfuse3.py
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,torch,bench]'
	touch $@

test: install
	$(BIN)/ruff check dlfs tests tools
	$(BIN)/pytest

demo: install
	PATH="$(CURDIR)/$(BIN):$$PATH" tools/demo.sh

lint: install
	$(BIN)/ruff check dlfs tests tools
	$(BIN)/ruff format --check dlfs tests tools

format: install
	$(BIN)/ruff format dlfs tests tools
	$(BIN)/ruff check --fix dlfs tests tools

# The 1.28 M-file metadata benchmark of issue 2 (takes a few minutes, needs ~6 GB of disk).
bench-scale: install
	$(BIN)/python tools/bench_scale.py --files 1281167

# Pack speed against tar cf on the same tree, in one run.
bench-pack: install
	$(BIN)/python tools/bench_pack.py

# Reading in the published order: native vs dlfs with and without read-ahead, warm and cold.
bench-read: install
	$(BIN)/python tools/bench_read.py

bench: bench-scale bench-pack bench-read

clean:
	rm -rf $(VENV) demo-data bench-data .pytest_cache .ruff_cache .hypothesis
