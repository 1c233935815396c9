PY ?= python3
PIP ?= $(PY) -m pip

.PHONY: install test demo completions bench clean

install:
	$(PIP) install torch==2.13.0 || $(PIP) install 'torch>=2.2,<=2.14.1'
	$(PIP) install -e '.[test]'

test: install
	$(PY) -m pytest

demo: install
	icml onemax-sim --mode worst-case --theta 16 --lam 0.5

completions:
	_ICML_COMPLETE=bash_source icml > completions/icml.bash
	_ICML_COMPLETE=zsh_source icml > completions/icml.zsh
	_ICML_COMPLETE=fish_source icml > completions/icml.fish

bench:
	$(PY) benchmarks/onemax_throughput.py

clean:
	rm -rf build *.egg-info .pytest_cache runs
