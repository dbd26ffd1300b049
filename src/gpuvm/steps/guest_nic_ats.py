"""guest.nic_ats: ATS (Address Translation Services) on the ConnectX cards passed through to a guest.

`mst status -v` lists the cards; `mlxconfig -d <dev> -e q ATS_ENABLED` reads each card once, through
its first function ("ca:00.0" and "ca:00.1" are one card), both what it runs now (Current) and what
it runs after the next cold boot (Next Boot); `mlxconfig -y -d <dev> set ATS_ENABLED=true` sets the
latter. A passed-through card is cold-booted only when its ESXi *host* reboots, so a set value is
pending until then: the plan marks it "needs host reboot", `host.reboot` reboots the VM's host, and
a value set but not active yet (Current differs) is shown as pending, by plan and verify alike.

This step runs before `host.reboot`, on the guests that answer when the plan is made, so the one
host reboot activates it. A guest that comes up only during apply is set then; its host reboot is
planned by the next run.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.errors import RemoteCommandError
from gpuvm.parsers.mlxconfig import AtsState, ats_state
from gpuvm.parsers.mst import MstDevice, parse_mst_status
from gpuvm.plan import Change, Disruption
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.remote import Cluster, run
from gpuvm.steps.base import Context, Step

NAME = "guest.nic_ats"


@dataclass(frozen=True)
class SetCardAts:
    device: str  # what mlxconfig is given: the mst device, else the card's PCI address
    value: bool


@dataclass(frozen=True)
class Card:
    pci: str  # the first function's address, "ca:00.0"
    mst: str  # "/dev/mst/mt4123_pciconf0"
    ats: AtsState


def wanted(target: DesiredGuest) -> bool:
    return target.nic_ats is not None


def query(device: str) -> list[str]:
    return ["mlxconfig", "-d", device, "-e", "q", "ATS_ENABLED"]


def observe(ctx: Context, target: DesiredGuest) -> list[Card]:
    return [Card(pci, dev, ats_state(run(target, ctx.cluster, query(dev), sudo=target.root).stdout))
            for pci, dev in _cards(_mst_devices(target, ctx.cluster))]


def _mst_devices(target: DesiredGuest, cluster: Cluster) -> list[MstDevice]:
    """`mst status -v`. Observing never runs `mst start` (a dry run loads no driver): without the
    mst device files, mlxconfig is given the card's PCI address instead."""
    return parse_mst_status(run(target, cluster, ["mst", "status", "-v"], sudo=target.root).stdout)


def _cards(devices: list[MstDevice]) -> list[tuple[str, str]]:
    """(pci, device for mlxconfig) of each card's first function."""
    cards: dict[str, tuple[str, str]] = {}
    for d in sorted(devices, key=lambda d: d.pci):
        cards.setdefault(d.pci.rsplit(".", 1)[0], (d.pci, d.mst or d.pci))
    return list(cards.values())


def plan(target: DesiredGuest, cards: list[Card]) -> list[Change]:
    want = target.nic_ats
    if not cards:
        raise target.error(NAME, ("nic_ats",), "nic_ats is set but `mst status -v` lists no Mellanox device")
    changes = []
    for card in cards:
        resource = f"ConnectX {card.pci} ({card.mst})"
        if card.ats.next_boot != want:
            changes.append(Change(NAME, target.name, resource, "ATS_ENABLED", card.ats.next_boot, want,
                                  Disruption.HOST_REBOOT, SetCardAts(card.mst, want)))
        elif card.ats.current != want:  # set before, not active until the host reboots
            changes.append(Change(NAME, target.name, resource, "ATS_ENABLED (current)", card.ats.current, want,
                                  Disruption.HOST_REBOOT))
    return changes


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    for change in changes:
        if isinstance(action := change.action, SetCardAts):
            value = "true" if action.value else "false"
            run(target, ctx.cluster, ["mlxconfig", "-y", "-d", action.device, "set", f"ATS_ENABLED={value}"],
                sudo=target.root)
            now = ats_state(run(target, ctx.cluster, query(action.device), sudo=target.root).stdout)
            if now.next_boot != action.value:
                raise RemoteCommandError(f"ATS_ENABLED on {action.device} reads {now.next_boot} for the next boot "
                                         "after the set")


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted)
