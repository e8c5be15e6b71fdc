# Two entry points for a new user on Debian 12 (run as root):
#   make demo   discover and carve this host (later: place and boot a real guest)
#   make test   the whole test suite (what .ci/run runs)
# Both install what is missing first and are fast when everything is present.

PYTHON  ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: demo test deps sysdeps venv clean test-unit

sysdeps:
	@bash tools/install-deps.sh

$(STAMP): setup.cfg pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@$(VPY) -m pip install -q --upgrade pip
	@$(VPY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

deps: sysdeps venv

demo: deps
	@bash tools/demo.sh

test: deps
	@bash tools/run-tests.sh

test-unit: venv
	@$(VPY) -m pytest -q -m "not integration" tests

clean:
	rm -rf $(VENV) build *.egg-info
