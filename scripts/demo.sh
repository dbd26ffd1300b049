#!/usr/bin/env bash
# The demo: the bundled simulated vCenter (two R750xa-like hosts, 4x A100 each), SSH test hosts
# standing in for the ESXi shells and the four guest OSes (network namespaces with real OpenSSH
# servers; needs root), the lab runbook, and the whole flow. With --from-template: a lab with no
# training VMs, only a template; playbooks/lab-from-template.yaml creates four, boots them (gpusim's
# power-on hook starts each as an SSH test host with its cloud-init address and key) and meshes them.
set -euo pipefail
FROM_TEMPLATE=false
[ "${1:-}" = --from-template ] && FROM_TEMPLATE=true
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "make demo needs root: the SSH test hosts live in network namespaces (run: sudo make demo)" >&2
  exit 2
fi
GPUVM=.venv/bin/gpuvm
RUNBOOK=playbooks/lab.yaml
WORK=$(mktemp -d /tmp/gpuvm-demo.XXXXXX)
BED=build/testbed                                 # the runbook finds the test hosts' keys here
export GPUVM_STATE_DIR=$WORK/state
exec 9>/tmp/gpuvm-testbed.lock && flock 9        # one test bed per machine (the tests take turns too)

.venv/bin/python testbed/bed.py up --root $BED --esxi 2 --guests 4 >/dev/null
if $FROM_TEMPLATE; then
  RUNBOOK=playbooks/lab-from-template.yaml
  build/gpusim -hosts 2 -vms-per-host 0 -template ubuntu-22.04-gpu -vm-version vmx-15 -rebind-without-reboot \
    -listen 127.0.0.1:0 -cert-out "$WORK/sim.pem" -on-power-on ".venv/bin/python testbed/bed.py boot \"\$GPUSIM_VM\" \
    --metadata \"\$GPUSIM_METADATA\" --userdata \"\$GPUSIM_USERDATA\" --root $BED" >"$WORK/sim.out" 2>"$WORK/sim.log" &
else
  build/gpusim -hosts 2 -vms-per-host 2 -mig esx-02=0,1 -listen 127.0.0.1:0 -cert-out "$WORK/sim.pem" \
    -on-reboot ".venv/bin/python testbed/bed.py reboot \"\$GPUSIM_HOST\" \$GPUSIM_VMS --root $BED" >"$WORK/sim.out" 2>"$WORK/sim.log" &
fi
SIM=$!
trap 'kill $SIM 2>/dev/null || true; .venv/bin/python testbed/bed.py down --root $BED >/dev/null' EXIT
for _ in $(seq 100); do grep -q GPUSIM_URL= "$WORK/sim.out" && break; sleep 0.1; done
export GOVC_URL=$(sed -n 's/^GPUSIM_URL=//p' "$WORK/sim.out")
export GOVC_TLS_CA_CERTS=$WORK/sim.pem           # TLS stays verified, against the simulator's certificate
export GPUVM_VCENTER_PASSWORD=gpusim-pass

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
# a `--max-overhead` verdict: fail (9) and inconclusive (10) are answers, the demo goes on
verdict() { local rc=0; step "$@" || rc=$?; case $rc in 0|9|10) ;; *) exit $rc ;; esac; }

echo "Simulated vCenter at $GOVC_URL; SSH test hosts on 10.250.0.0/24; state and journal in $WORK"
step $GPUVM validate $RUNBOOK
step $GPUVM inventory $RUNBOOK
step $GPUVM plan $RUNBOOK  # --from-template: the new VMs' guests are known after apply
if $FROM_TEMPLATE; then  # new guests: their host keys are learnt on first contact
  step $GPUVM apply $RUNBOOK --yes --accept-new-host-keys
  step $GPUVM plan $RUNBOOK
  step $GPUVM verify $RUNBOOK
  exit 0
fi
step $GPUVM apply $RUNBOOK --yes --allow-host-reboot
step $GPUVM plan $RUNBOOK
step $GPUVM verify $RUNBOOK

# The benchmark campaign: a real data-parallel training (gpuvm's PyTorch workload, a small ResNet-18,
# DistributedDataParallel over gloo, launched by mpirun) across the guests over the SSH mesh gpuvm
# just set up, and the same on this machine as the bare-metal baseline.
step $GPUVM bench run $RUNBOOK --repeats auto --out $WORK/results
step $GPUVM bench run $RUNBOOK --repeats auto --local --out $WORK/baseline
VM=$(ls -d $WORK/results/*/) BM=$(ls -d $WORK/baseline/*/)
verdict $GPUVM bench compare "$VM" --baseline "$BM" --max-overhead 2%
verdict $GPUVM bench report "$VM" --baseline "$BM" --max-overhead 2% --out $WORK/report-lab

# The Dell study (R750xa, 4x A100, ConnectX-6), from its published numbers.
verdict $GPUVM bench compare playbooks/results/study-vm --baseline playbooks/results/study-baremetal.yaml --max-overhead 2%
step $GPUVM bench report playbooks/results/study-vm --baseline playbooks/results/study-baremetal.yaml --out $WORK/report
echo
echo "Reports: $WORK/report/report.html (the study), $WORK/report-lab/report.html (this lab)"
