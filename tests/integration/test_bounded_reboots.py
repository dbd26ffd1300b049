"""Bounded reboots (issue 21, item 4), the tenant's case: a guest whose ConnectX card answers
`mlxconfig -e q` with ATS "Next Boot True, Current False" whatever happens made every
`apply --allow-host-reboot --allow-power-off` reboot its host. Now the first apply reboots once and
records why on the host; the second stops up front (exit 4) naming the setting and the host,
rebooting nothing and powering nothing off; a third with --allow-repeat-reboot reboots again. Once
the card runs the setting, the next apply clears the memo."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import BED, raw_state, reboot_hook, use_simulator

pytestmark = pytest.mark.integration
GUEST = "gpu-vm-01"  # esx-01-vm1's guest in the bed (one VM per host)
STUCK = {"default": "False(0)", "current": "False(0)", "next": "True(1)"}


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def runbook(bed, path):
    guest = bed.host(GUEST)
    path.write_text(f"""\
vcenter: {{user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}}
ssh: {{known_hosts: {bed.known_hosts_file}}}
hosts: [{{name: esx-01, allow_maintenance: true, allow_reboot: true}}]
vms: [{{name: esx-01-vm1, host: esx-01, firmware: bios}}]
guests:
  hosts:
    - vm: esx-01-vm1
      ssh: {{address: {guest.address}, user: {guest.user}, key_file: {guest.key_file}, sudo: true}}
      nic_ats: true
""")
    return path


def stuck_after_reboot(bed) -> str:
    """gpusim's -on-reboot: the bed's reboot (next-boot values become current), then the card's ATS
    back to not running: a setting this host's reboot never activates."""
    state = bed.host_dir(GUEST) / "fake"
    reset = (f"import sys; sys.path.insert(0, {str(BED.parent / 'bin')!r}); import _gpuvm_fake as f; "
             f"f.STATE_DIR, f.STATE_FILE, f.LOCK_FILE = {str(state)!r}, {str(state / 'state.json')!r}, "
             f"{str(state / 'state.lock')!r}\n"
             f"with f.locked_state() as s: s['mlx']['ATS_ENABLED'] = {STUCK!r}")
    return f"{reboot_hook(bed, vms_per_host=1)} && {shlex.quote(sys.executable)} -c {shlex.quote(reset)}"


@pytest.fixture
def stuck_card(testbed):
    saved = testbed.state(GUEST)["mlx"]
    testbed.set_state(GUEST, "mlx", {"ATS_ENABLED": dict(STUCK)})
    yield
    testbed.set_state(GUEST, "mlx", saved)


def test_a_setting_a_reboot_does_not_activate_reboots_the_host_once_then_stops_with_exit_4(
        testbed, stuck_card, tmp_path, monkeypatch):
    book = runbook(testbed, tmp_path / "rb.yaml")
    flags = ("--yes", "--allow-host-reboot", "--allow-power-off")
    with Simulator(hosts=1, vms_per_host=1, vm_power="on", on_reboot=stuck_after_reboot(testbed)) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        booted = raw_state(sim)["esx-01"]["booted"]
        first = gpuvm("apply", str(book), *flags)
        assert first.exit_code == 0, first.output
        after_first = raw_state(sim)
        assert after_first["esx-01"]["booted"] != booted, "the first apply did not reboot"
        assert testbed.state(GUEST)["mlx"]["ATS_ENABLED"] == STUCK  # still pending after it

        planned = json.loads(gpuvm("plan", str(book), "--json").output)
        [note] = [n for n in planned["notes"] if n["level"] == "error"]
        assert note["target"] == "esx-01" and "ATS_ENABLED" in note["message"] and "--allow-repeat-reboot" in note["message"]

        second = gpuvm("apply", str(book), *flags)
        assert second.exit_code == 4, second.output
        assert "esx-01" in second.output and "ATS_ENABLED" in second.output and "esx-01-vm1" in second.output
        assert "still pending after gpuvm rebooted the host" in second.output and "Traceback" not in second.output
        assert raw_state(sim) == after_first, "the refused apply rebooted or powered off something"

        third = gpuvm("apply", str(book), *flags, "--allow-repeat-reboot")
        assert third.exit_code == 0, third.output
        assert raw_state(sim)["esx-01"]["booted"] != after_first["esx-01"]["booted"], "no second reboot"
        assert raw_state(sim)["esx-01-vm1"]["power"] == "poweredOn"
        assert gpuvm("apply", str(book), *flags).exit_code == 4  # the new memo holds it again
        assert memo(sim) is not None

        testbed.set_state(GUEST, "mlx", {"ATS_ENABLED": dict(STUCK, current="True(1)")})  # the card is fixed
        settled = gpuvm("apply", str(book), *flags)
        assert settled.exit_code == 0, settled.output
        assert memo(sim) is None, "nothing waits on esx-01 any more: its memo stays"
        assert gpuvm("verify", str(book)).exit_code == 0


def memo(sim: Simulator):
    """The reboot memo on esx-01, read back with gpuvm's inventory read."""
    from gpuvm.runbook.vcenters import VCenter
    from gpuvm.vsphere.inventory import read_inventory
    from gpuvm.vsphere.session import Session, resolve_target

    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        return read_inventory(session).hosts["esx-01"].intents.get("rebooted")
