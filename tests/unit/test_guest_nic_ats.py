"""guest.nic_ats: ConnectX ATS read both ways (Current and Next Boot), observed and applied on a fake."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuvm.errors import InputError
from gpuvm.executors.fake import FakeExecutor, ok
from gpuvm.parsers.mlxconfig import AtsState
from gpuvm.plan import Disruption
from gpuvm.steps import guest_nic_ats
from gpuvm.steps.base import Context
from gpuvm.steps.guest_nic_ats import Card
from tests.unit.test_guest_nic import cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools"
MST = "/dev/mst/mt4123_pciconf0"
CARD = f"ConnectX ca:00.0 ({MST})"


def card(current: bool, next_boot: bool) -> list[Card]:
    return [Card("ca:00.0", MST, AtsState(current, next_boot))]


@pytest.mark.parametrize("guest, observed, expected", [
    ("nic_ats: true", card(False, False), [(CARD, "ATS_ENABLED", False, True, Disruption.HOST_REBOOT, False)]),
    ("nic_ats: true", card(True, True), []),
    # set by an earlier run, the host not rebooted since: pending, and nothing for this step to do
    ("nic_ats: true", card(False, True), [(CARD, "ATS_ENABLED (current)", False, True, Disruption.HOST_REBOOT, True)]),
    ("nic_ats: false", card(True, True), [(CARD, "ATS_ENABLED", True, False, Disruption.HOST_REBOOT, False)]),
])
def test_plan(tmp_path, guest, observed, expected):
    changes = guest_nic_ats.plan(cluster(tmp_path, guest).targets["gpu-vm-01"], observed)
    assert [(c.resource, c.field, c.before, c.after, c.disruption, c.pending) for c in changes] == expected


def test_plan_refuses_without_a_card(tmp_path):
    with pytest.raises(InputError, match=r"guests\.hosts\[0\]\.nic_ats: guest\.nic_ats: guest gpu-vm-01: nic_ats is set "
                                         r"but `mst status -v` lists no Mellanox device"):
        guest_nic_ats.plan(cluster(tmp_path, "nic_ats: true").targets["gpu-vm-01"], [])


class FakeCard:
    """mst and mlxconfig over one dual-port ConnectX-6: a set value waits for the next boot."""

    def __init__(self, started=False):
        self.started, self.current, self.next = started, False, False

    def responses(self):
        return {
            "mst status -v": lambda call: ok("", self.mst_status()),
            re.compile(r"^mlxconfig -d (\S+) -e q ATS_ENABLED$"): self.query,
            re.compile(r"^mlxconfig -y -d \S+ set ATS_ENABLED=true$"): self.set_ats,
        }

    def mst_status(self):
        text = (FIXTURES / "mst_status_v.txt").read_text()
        return text if self.started else re.sub(r"/dev/mst/\S+", "NA", text).replace("module loaded", "module is not loaded")

    def query(self, call):
        value = {True: "True(1)", False: "False(0)"}
        text = (FIXTURES / "mlxconfig_e_q_ats_pending.txt").read_text()
        return ok("", re.sub(r"(ATS_ENABLED\s+)\S+\s+\S+\s+\S+",
                             rf"\g<1>False(0)        {value[self.current]:<16}{value[self.next]}", text))

    def set_ats(self, call):
        self.next = True
        return ok("", (FIXTURES / "mlxconfig_set_ats.txt").read_text())


def test_observe_never_starts_mst_and_queries_each_card_once_by_pci_address(tmp_path):
    fake = FakeExecutor("gpu-vm-01", FakeCard().responses())
    c = cluster(tmp_path, "nic_ats: true", fake)
    assert guest_nic_ats.observe(Context(cluster=c), c.targets["gpu-vm-01"]) == [
        Card("ca:00.0", "ca:00.0", AtsState(False, False))]
    assert fake.commands == ["sudo -n mst status -v", "sudo -n mlxconfig -d ca:00.0 -e q ATS_ENABLED"]


def test_apply_sets_next_boot_then_the_plan_shows_it_pending_until_the_reboot(tmp_path):
    state = FakeCard(started=True)
    fake = FakeExecutor("gpu-vm-01", state.responses())
    c = cluster(tmp_path, "nic_ats: true", fake)
    target, ctx = c.targets["gpu-vm-01"], Context(cluster=c)
    changes = guest_nic_ats.plan(target, guest_nic_ats.observe(ctx, target))
    fake.calls.clear()
    guest_nic_ats.apply(ctx, target, changes)
    assert fake.commands == [f"sudo -n mlxconfig -y -d {MST} set ATS_ENABLED=true", f"sudo -n mlxconfig -d {MST} -e q ATS_ENABLED"]
    [pending] = guest_nic_ats.plan(target, guest_nic_ats.observe(ctx, target))
    assert pending.pending and pending.field == "ATS_ENABLED (current)"
    state.current = state.next  # the host rebooted
    assert guest_nic_ats.plan(target, guest_nic_ats.observe(ctx, target)) == []


def test_wanted(tmp_path):
    assert not guest_nic_ats.wanted(cluster(tmp_path, "slots: 1").targets["gpu-vm-01"])
    assert guest_nic_ats.wanted(cluster(tmp_path, "nic_ats: false").targets["gpu-vm-01"])
