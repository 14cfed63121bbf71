# The two commands a new user needs: `make demo` and `make test`. Each installs what it needs.
VENV ?= .venv
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the test suite starts as real servers on 127.0.0.1.
TEST_APT_PACKAGES := influxdb victoria-metrics prometheus chromium chromium-driver systemd prometheus-alertmanager

.PHONY: demo test install test-deps lint typecheck format bench clean screenshots

# `make demo` installs what the product needs (the dashboard extra); `make test` adds the test tools.
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip "setuptools>=77" wheel

$(VENV)/.installed-demo: pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -e ".[dashboard]"
	touch $@

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -e ".[test]"
	touch $@ $(VENV)/.installed-demo

install: $(VENV)/.installed

demo: $(VENV)/.installed-demo
	$(VENV)/bin/gpuwatt demo $(ARGS)

test-deps:
	@missing=""; for p in $(TEST_APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

test: install test-deps lint typecheck
	$(VENV)/bin/pytest

# Every page at 1,600 and 800 px, light and dark (build/screenshots); the README's pictures are copied
# to docs/screenshots.
screenshots: install test-deps
	$(VENV)/bin/python tools/screenshots.py --out build/screenshots --readme docs/screenshots

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install
	$(VENV)/bin/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
