#!/usr/bin/env bash
# The demo: the bundled simulated vCenter (two R750xa-like hosts, 4x A100 each), the lab runbook,
# and the whole flow — validate, inventory, plan, apply, re-plan, verify, then a drift and verify.
set -euo pipefail
cd "$(dirname "$0")/.."
GPUVM=.venv/bin/gpuvm
RUNBOOK=playbooks/lab.yaml
WORK=$(mktemp -d /tmp/gpuvm-demo.XXXXXX)
export GPUVM_STATE_DIR=$WORK/state

build/gpusim -hosts 2 -vms-per-host 2 -listen 127.0.0.1:0 -cert-out "$WORK/sim.pem" >"$WORK/sim.out" 2>"$WORK/sim.log" &
SIM=$!
trap 'kill $SIM 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q GPUSIM_URL= "$WORK/sim.out" && break; sleep 0.1; done
export GOVC_URL=$(sed -n 's/^GPUSIM_URL=//p' "$WORK/sim.out")
export GOVC_TLS_CA_CERTS=$WORK/sim.pem           # TLS stays verified, against the simulator's certificate
export GPUVM_VCENTER_PASSWORD=gpusim-pass

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

echo "Simulated vCenter at $GOVC_URL (state and journal in $WORK)"
step $GPUVM validate $RUNBOOK
step $GPUVM inventory $RUNBOOK
step $GPUVM plan $RUNBOOK
step $GPUVM apply $RUNBOOK --yes --allow-host-reboot
step $GPUVM plan $RUNBOOK
step $GPUVM verify $RUNBOOK
echo
echo "Someone turns P2P off by hand on esx-01-vm1; verify notices:"
$GPUVM plan $RUNBOOK --json >/dev/null
.venv/bin/python - <<'PY'
import os, ssl
from pyVim.connect import SmartConnect, Disconnect
from pyVmomi import vim
from urllib.parse import urlsplit
u = urlsplit(os.environ["GOVC_URL"])
si = SmartConnect(host=u.hostname, port=u.port, user="administrator@vsphere.local", pwd=os.environ["GPUVM_VCENTER_PASSWORD"],
                  sslContext=ssl.create_default_context(cafile=os.environ["GOVC_TLS_CA_CERTS"]))
vm = si.content.searchIndex.FindByInventoryPath("DC0/vm/esx-01-vm1") or next(
    v for v in si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True).view if v.name == "esx-01-vm1")
vm.ReconfigVM_Task(spec=vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key="pciPassthru.allowP2P", value="false")]))
Disconnect(si)
PY
sleep 0.5
set +e
step $GPUVM verify $RUNBOOK
echo "(verify exit code: $?)"
