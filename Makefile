PY ?= python3
PIP ?= $(PY) -m pip

.PHONY: install test test-fast lint demo completions bench clean

# The byte-compile: an editable install leaves it to each module's first import, which PYTHONDONTWRITEBYTECODE (set
# on our machines) turns off, so every command compiled the sources it imports, every run (the merge loops' module
# took 0.064-0.067 s to import from source, 0.039-0.044 s byte-compiled).
install:
	$(PIP) install torch==2.13.0 || $(PIP) install 'torch>=2.2,<=2.14.1'
	$(PIP) install -e '.[test]'
	$(PY) -m compileall -q icmltools commands

lint:
	$(PY) -m ruff check .

# The README's test command: install, lint, the whole suite (CPU only) on $(WORKERS) pytest-xdist workers
# (serial, it took 16-18 min on a 2-core machine; the slowest test alone, guidedquant's three demo seeds, ~5 min).
WORKERS ?= 2
test: install lint
	$(PY) -m pytest -n $(WORKERS) --dist worksteal

# Everything but the tests marked slow, on $(WORKERS) pytest-xdist workers (no install step: for the edit-test loop).
test-fast: lint
	$(PY) -m pytest -m "not slow" -n $(WORKERS) --dist worksteal

# The main demo: a summary table on the terminal (stderr); the JSON document goes to runs/demo.json.
demo: install
	@mkdir -p runs
	icml onemax-sim --mode worst-case --theta 16 --lam 0.5 > runs/demo.json
	@echo "JSON: runs/demo.json (icml onemax-sim --mode worst-case --theta 16 --lam 0.5 | jq .result)"

completions:
	_ICML_COMPLETE=bash_source icml > completions/icml.bash
	_ICML_COMPLETE=zsh_source icml > completions/icml.zsh
	_ICML_COMPLETE=fish_source icml > completions/icml.fish

bench:
	$(PY) benchmarks/onemax_throughput.py

clean:
	rm -rf build *.egg-info .pytest_cache runs
