"""Planning a host that lists thousands of PCI devices (an inventory snapshot may say so) does work
in proportion to them, not to their square (issue 22, item 9: 8,000 devices took 26 s). Counted,
not timed: how often the host's device list is walked and how many GPU sets are scored."""

from __future__ import annotations

import itertools

import pytest

import gpuvm.topology
from gpuvm.engine import make_plan
from gpuvm.vsphere.facts import PciDevice
from tests.unit.factories import inventory, r750xa, vm
from tests.unit.test_plan_steps import HOST, runbook


class CountedList(list):
    """A list that counts how often it is walked."""

    walks = 0

    def __iter__(self):
        CountedList.walks += 1
        return super().__iter__()


def _work(tmp_path, monkeypatch, extra_gpus: int) -> tuple[int, int]:
    host = r750xa(enabled=True, active=True)
    host.pci.extend(PciDevice(id=f"0001:{i >> 8:02x}:{i & 0xff:02x}.0", vendor_id=0x10DE, device_id=0x20B5,
                              device_name="GA100 [A100 PCIe 80GB]", class_id=0x0302, numa_node=i % 2,
                              passthru_capable=True, passthru_enabled=True, passthru_active=True)
                    for i in range(extra_gpus))
    host.pci = CountedList(host.pci)
    scored = []
    real = itertools.combinations

    def counted(items, count):
        for chosen in real(items, count):
            scored.append(1)
            yield chosen

    monkeypatch.setattr(gpuvm.topology, "combinations", counted)
    CountedList.walks = 0
    vms = "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}}\n" \
          "- {name: vm2, host: esx-01, gpus: {mode: passthrough, count: 4}}\n"
    _, desired = make_plan(runbook(tmp_path, vms, HOST), inventory([host], [vm("vm1"), vm("vm2")]))
    assert len(desired.vms["vm1"].devices) == 2 and len(desired.vms["vm2"].devices) == 4
    return CountedList.walks, len(scored)


def test_planning_work_does_not_grow_with_the_square_of_the_devices(tmp_path, monkeypatch):
    small = _work(tmp_path, monkeypatch, 100)
    large = _work(tmp_path, monkeypatch, 3000)
    walks, scored = large
    assert walks == small[0], (small, large)  # each walk of the device list is one pass, whatever its length
    assert scored == small[1] and scored < 20_000, (small, large)  # GPU sets scored: bounded


@pytest.mark.parametrize("gpus", [4, 9])
def test_the_chosen_gpus_are_those_an_exhaustive_search_picks(gpus):
    """The reduced search keeps the exhaustive one's choice (on hosts small enough for both)."""
    from gpuvm.desired import Nvlink
    from gpuvm.topology import best_set

    devices = [PciDevice(id=f"0000:{i:02x}:00.0", vendor_id=0x10DE, device_id=0x20B5, class_id=0x0302,
                         numa_node=i % 3 // 2, passthru_capable=True) for i in range(gpus)]
    pairs = tuple((devices[i].id, devices[i + 1].id) for i in range(0, gpus - 1, 3))
    for nvlink in (Nvlink(), Nvlink(pairs, "test")):
        for count in range(1, gpus):
            for numa in (None, 0, 1):
                cost = {d.id: (i * 7) % 3 for i, d in enumerate(devices)}
                got = best_set(devices, count, numa, nvlink, lambda d: cost[d.id])
                free = {d.id for d in devices}

                def score(chosen):
                    ids = {d.id for d in chosen}
                    alone = [d for d in chosen if nvlink.knows(d.id) and nvlink.partner(d.id) not in ids]
                    return (sum(numa is not None and d.numa_node != numa for d in chosen), len(alone) if count > 1 else 0,
                            len({d.numa_node for d in chosen}), sum(nvlink.partner(d.id) in free for d in alone),
                            sum(cost[d.id] for d in chosen))

                best = min(itertools.combinations(devices, count), key=score)
                assert score(got) == score(best), (count, numa, nvlink)


def test_a_host_of_gpus_all_unlike_is_planned_without_an_exhaustive_search(monkeypatch):
    """200 GPUs, each on a NUMA node of its own: nothing to merge, so past MAX_SETS a few good sets
    are scored instead of C(200, 4) = 64 million."""
    from gpuvm.desired import Nvlink
    from gpuvm.topology import best_set

    monkeypatch.setattr(gpuvm.topology, "combinations", lambda *a: pytest.fail("exhaustive search"))
    devices = [PciDevice(id=f"0000:{i >> 8:02x}:{i & 0xff:02x}.0", vendor_id=0x10DE, device_id=0x20B5,
                         class_id=0x0302, numa_node=i, passthru_capable=True) for i in range(200)]
    chosen = best_set(devices, 4, 7, Nvlink(), lambda d: 0)
    assert len({d.id for d in chosen}) == 4 and chosen[0].numa_node == 7  # the node asked for comes first
