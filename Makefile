# gpuvm: two commands on a fresh Debian machine (as root, or with sudo for the apt step).
#   make demo   installs, builds and starts the bundled simulated vCenter, shows the whole flow
#   (make demo-from-template: the same from a lab with no VMs, only a template)
#   make test   installs everything the tests need (simulator, SSH test hosts, Open MPI, PyTorch, Slurm), runs all tests
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := golang-go golang-github-vmware-govmomi-dev openssh-server sudo iproute2 openmpi-bin \
                slurmctld slurmd slurm-client munge libpmix-dev \
                python3-torch python3-torchvision docker.io debootstrap fio gnupg curl
GOVMOMI := /usr/share/gocode/src/github.com/vmware/govmomi

.PHONY: demo demo-from-template test deps apt venv sim base-image bench clean

demo: deps
	bash scripts/demo.sh

demo-from-template: deps
	bash scripts/demo.sh --from-template

test: deps base-image
	$(VENV)/bin/pytest -q

bench: deps
	$(PY) bench/plan_scaling.py
	$(PY) bench/apply_parallel.py
	$(PY) bench/cli_startup.py
	$(PY) bench/runbook_load.py
	if [ "$$(id -u)" = 0 ]; then $(PY) bench/ssh_mesh.py && $(PY) bench/container_path.py; fi

deps: apt venv sim

# No service starts while installing (a temporary policy-rc.d): a dockerd in the root namespace would
# set the FORWARD policy to DROP and cut the SSH test bed. The tests start their own daemons.
apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  guard=; if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    printf '#!/bin/sh\nexit 101\n' | $$SUDO tee /usr/sbin/policy-rc.d >/dev/null && $$SUDO chmod 755 /usr/sbin/policy-rc.d; guard=1; \
	  fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; rc=$$?; \
	  if [ -n "$$guard" ]; then $$SUDO rm -f /usr/sbin/policy-rc.d; fi; exit $$rc; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

sim: build/gpusim

# The container test's Debian base (debootstrap, with the packages gpuvm's Dockerfile installs), made
# before the test run, not in it; cached under build/base-images. Root only, as that test is.
base-image: apt
	if [ "$$(id -u)" = 0 ]; then python3 testbed/base_image.py --preloaded; fi

build/gpusim: $(wildcard simulator/gpusim/*.go)
	$(PY) simulator/gpusim.py build

clean:
	rm -rf build $(VENV) .gpuvm results reports
