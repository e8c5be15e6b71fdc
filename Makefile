# Two entry points for a new user on Debian 12 (run as root):
#   make demo   carve this host, start scheduler + hostd, place and boot a real guest, profile its exits
#   make test   the whole test suite (what .ci/run runs)
# Both install what is missing first and are fast when everything is present.

PYTHON  ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: demo test deps sysdeps venv stubs clean test-unit kernel-build images console-assets

sysdeps:
	@bash tools/dev/install-deps.sh

$(STAMP): setup.cfg pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@$(VPY) -m pip install -q --upgrade pip
	@$(VPY) -m pip install -q -e '.[test,fleet]'
	@touch $(STAMP)

venv: $(STAMP)

# gRPC stubs are generated at build time from the contract, never edited.
PROTO_OUT := api/hostd_pb2.py api/hostd_pb2_grpc.py
$(PROTO_OUT) &: api/hostd.proto $(STAMP)
	@$(VPY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. api/hostd.proto

stubs: $(PROTO_OUT)

# The web console's JavaScript (ECharts, htmx): pinned, checksummed, from the npm
# registry, never committed (scheduler/console/static/vendor/ is ignored).
console-assets:
	@bash tools/dev/fetch-console-assets.sh

deps: sysdeps venv stubs console-assets

demo: deps
	@bash tools/dev/demo.sh

test: deps
	@bash tools/dev/run-tests.sh

test-unit: venv stubs
	@$(VPY) -m pytest -q -m "not integration" tests

# Guest images (cached under /var/cache/hybrid-kvm; `make test` builds them too).
images: sysdeps
	@bash guestimages/smoke/build.sh /var/cache/hybrid-kvm/smoke
	@bash guestimages/online/build.sh /var/cache/hybrid-kvm/online

# Opt-in (35 min on 2 CPUs): build the nohlt_list guest kernel and boot-test it.
kernel-build: deps
	@HYB_KERNEL_BUILD=1 $(VPY) -m pytest -q tests/kernel_patches

clean:
	rm -rf $(VENV) build *.egg-info $(PROTO_OUT) api/hostd_pb2.pyi
