# CacheSafe. `make run` serves on 127.0.0.1:$PORT (default 8000); `make test` runs the suite.
# Both create the virtualenv and install the pinned dependencies on first use.

PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint format lock install install-probe probe-worker clean

run: $(STAMP)
	$(PY) manage.py serve

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run.py $(BENCH)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports --no-cache

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

install: $(STAMP)

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# Also puts the project's folder on the venv's path (a .pth file, as an editable install
# would), so `.venv/bin/python -m checks` runs from any folder, a CI job's checkout included.
$(STAMP): requirements.lock Makefile | $(UV)
	test -x $(PY) || $(UV) venv --quiet --python $(PYTHON) $(VENV)
	$(UV) pip sync --quiet --system-certs --compile-bytecode --python $(PY) --require-hashes requirements.lock
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "cachesafe-project.pth").write_text(str(pathlib.Path.cwd().resolve()) + "\n")'
	touch $@

# The Mac probe worker: Python dependencies only, then the mlx queue alone.
install-probe: | $(UV)
	test -x $(PY) || $(UV) venv --quiet --python $(PYTHON) $(VENV)
	$(UV) pip sync --quiet --system-certs --compile-bytecode --python $(PY) --require-hashes requirements.lock

probe-worker:
	$(VENV)/bin/celery -A workers worker -Q mlx --pool solo --concurrency 1 -n mac@%h --loglevel INFO

# Re-pin after editing pyproject.toml.
lock: $(UV)
	$(UV) pip compile pyproject.toml --extra probe --group dev --universal \
		--python-version 3.11 --generate-hashes --no-header --quiet -o requirements.lock

clean:
	rm -rf $(VENV) $(TOOLS)
