"""Helpers for tests against the simulated vCenter: environment for gpuvm, and an independent read-back."""

from __future__ import annotations

import shlex
import ssl
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from gpusim import Simulator

# GPUs in MIG mode for the lab's MIG-backed vGPU (playbooks/lab.yaml, esx-02's `mig: [0, 1]`). gpusim has
# no ESXi shell: MIG modes are given when it starts (the test hosts standing in for ESXi shells keep their own).
LAB_MIG = {"esx-02": "0,1"}


BED = Path(__file__).resolve().parents[2] / "testbed" / "bed.py"


def reboot_hook(testbed: Any, vms_per_host: int = 2) -> str:
    """gpusim's -on-reboot for the SSH test bed: a host reboot reboots the host's test host and the
    guests of its VMs (their passed-through ConnectX cards take their next-boot settings)."""
    return (f'{shlex.quote(sys.executable)} {BED} reboot "$GPUSIM_HOST" $GPUSIM_VMS --root {testbed.root} '
            f'--vms-per-host {vms_per_host}')


def boot_hook(testbed: Any) -> str:
    """gpusim's -on-power-on for the SSH test bed: a VM powered on with cloud-init data boots a
    guest with that identity (address, authorised key) in the bed (`bed.py boot`)."""
    return (f'{shlex.quote(sys.executable)} {BED} boot "$GPUSIM_VM" --metadata "$GPUSIM_METADATA" '
            f'--userdata "$GPUSIM_USERDATA" --root {testbed.root}')


def guest_ssh(bed: Any, name: str) -> str:
    """The runbook's `ssh:` mapping for the bed's guest `name`."""
    h = bed.host(name)
    return f"{{address: {h.address}, user: {h.user}, key_file: {h.key_file}}}"


def env_for(sim: Simulator) -> dict[str, str]:
    return {"GOVC_URL": sim.url, "GOVC_TLS_CA_CERTS": str(sim.cert_file), "GOVC_USERNAME": sim.username,
            "GPUVM_VCENTER_PASSWORD": sim.password}


def use_simulator(monkeypatch: Any, sim: Simulator, state_dir: Any = None) -> None:
    """Point gpuvm (govc's variables, the runbook's password_env) at `sim`, and at `state_dir`."""
    for key, value in env_for(sim).items():
        monkeypatch.setenv(key, value)
    if state_dir is not None:
        monkeypatch.setenv("GPUVM_STATE_DIR", str(state_dir))


@contextmanager
def pyvmomi(sim: Simulator) -> Iterator[Any]:
    from pyVim.connect import Disconnect, SmartConnect

    si = SmartConnect(host=sim.host, port=sim.port, user=sim.username, pwd=sim.password,
                      sslContext=ssl.create_default_context(cafile=str(sim.cert_file)))
    try:
        yield si
    finally:
        Disconnect(si)


@contextmanager
def simulated_vcenters(monkeypatch: Any, tmp_path: Path, options: dict[str, dict[str, Any]]) -> Iterator[
        tuple[dict[str, Simulator], list[str]]]:
    """One simulator per named vCenter (`options`: its Simulator options), govc's variables unset so
    every setting comes from the runbook: yields them and the runbook's `vcenters:` lines (each with
    its own password variable and CA file, kept when its simulator stops)."""
    for key in ("GOVC_URL", "GOVC_USERNAME", "GOVC_PASSWORD", "GOVC_TLS_CA_CERTS", "GOVC_INSECURE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
    sims = {name: Simulator(password=f"{name}-pass", **opts) for name, opts in options.items()}
    for sim in sims.values():
        sim.start()
    try:
        lines = ["vcenters:"]
        for name, sim in sims.items():
            monkeypatch.setenv(f"{name.upper()}_PASSWORD", sim.password)
            ca = tmp_path / f"{name}-ca.pem"
            ca.write_bytes(sim.cert_file.read_bytes())
            lines.append(f"  - {{name: {name}, url: '{sim.url}', user: '{sim.username}', "
                         f"password_env: {name.upper()}_PASSWORD, ca_file: '{ca}'}}")
        yield sims, lines
    finally:
        for sim in sims.values():
            sim.stop()


def raw_state(sim: Simulator) -> dict[str, Any]:
    """Everything gpuvm may change, read attribute by attribute with plain pyvmomi (not gpuvm's reader)."""
    from pyVmomi import vim

    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.HostSystem, vim.VirtualMachine], True)
        state: dict[str, Any] = {}
        for obj in view.view:
            if isinstance(obj, vim.HostSystem):
                state[obj.name] = {
                    "passthru": sorted((p.id, p.passthruEnabled, p.passthruActive) for p in obj.config.pciPassthruInfo),
                    "graphics": obj.config.graphicsConfig.hostDefaultGraphicsType,
                    "gpus_run": sorted((g.pciId, g.graphicsType) for g in obj.config.graphicsInfo),
                    "maintenance": obj.runtime.inMaintenanceMode,
                    "booted": obj.runtime.bootTime,
                    "vgpu_types": len(obj.config.sharedPassthruGpuTypes or []),
                }
            else:
                cfg = obj.config
                state[obj.name] = {
                    "power": str(obj.runtime.powerState), "firmware": cfg.firmware, "cpus": cfg.hardware.numCPU,
                    "memory": cfg.hardware.memoryMB, "reserved": cfg.memoryReservationLockedToMax, "version": cfg.version,
                    "pci": sorted(type(d.backing).__name__ + ":" + str(getattr(d.backing, "id", "") or getattr(d.backing, "vgpu", ""))
                                  for d in cfg.hardware.device if isinstance(d, vim.vm.device.VirtualPCIPassthrough)),
                    "extra": sorted((o.key, str(o.value)) for o in cfg.extraConfig if o.key.startswith(("pciPassthru", "numa."))),
                }
        view.DestroyView()
        return state


# A run killed outright (SIGKILL) cannot release its host locks: they hold until its lease expires
# (liveness is expiry only, vsphere/lock.py). Tests give the run they kill a short lease, and re-run
# once it has expired.
KILLED_RUN_LEASE = {"GPUVM_LOCK_TTL": "3"}


def once_unlocked(rerun: Callable[[], Any], exit_code: Callable[[Any], int], timeout: float = 15) -> Any:
    """`rerun()` again while it is refused with exit code 7 (the killed run's lease not expired yet)."""
    deadline = time.monotonic() + timeout
    while True:
        result = rerun()
        if exit_code(result) != 7 or time.monotonic() >= deadline:
            return result
        time.sleep(0.5)
