"""MIG: layout expansion, and the esxi.mig and guest.mig steps (plans from plain facts, apply on a fake)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gpuvm import mig
from gpuvm.steps.base import Context
from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor, ok
from gpuvm.mig import GpuLayout, MigLayoutError
from gpuvm.parsers.nvidia_smi import MigMode
from gpuvm.plan import Disruption
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.runbook.guests import MigDevices
from gpuvm.steps import esxi_mig, guest_mig
from gpuvm.steps.guest_mig import GpuMig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools"
A100_80 = "NVIDIA A100 80GB PCIe"
A100_40 = "NVIDIA A100-PCIE-40GB"
FOUR_80 = {i: A100_80 for i in range(4)}
LGIP = ("nvidia-smi mig -lgip", ok("", (FIXTURES / "nvidia_smi_mig_lgip.txt").read_text()))  # the A100 80GB's list


def entries(*items: dict) -> list[MigDevices]:
    return [MigDevices.model_validate(item) for item in items]


# -- layout expansion -------------------------------------------------------------------------

@pytest.mark.parametrize("layout, gpus, expected", [
    ("all-disabled", FOUR_80, {i: GpuLayout(False) for i in range(4)}),
    ("all-enabled", {0: A100_80}, {0: GpuLayout(True)}),
    ("all-3g.40gb", {0: A100_80, 1: A100_80}, {i: GpuLayout(True, ("3g.40gb",) * 2) for i in (0, 1)}),
    ("all-1g.10gb", {0: A100_80}, {0: GpuLayout(True, ("1g.10gb",) * 7)}),
    ("all-1g.20gb", {0: "NVIDIA H100 PCIe"}, {0: GpuLayout(True, ("1g.20gb",) * 4)}),
    ("all-7g.80gb", {0: "NVIDIA A100-SXM4-80GB"}, {0: GpuLayout(True, ("7g.80gb",))}),
    ("all-1g.5gb", {0: A100_40}, {0: GpuLayout(True, ("1g.5gb",) * 7)}),
    ("all-2g.10gb", {0: "A100-SXM4-40GB"}, {0: GpuLayout(True, ("2g.10gb",) * 3)}),
    ("all-2g.12gb", {0: "NVIDIA A30"}, {0: GpuLayout(True, ("2g.12gb",) * 2)}),
    (entries({"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}),
     FOUR_80, {0: GpuLayout(True, ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))}),
    (entries({"devices": [1, 3], "mig-enabled": False}, {"devices": [0], "mig-enabled": True, "mig-devices": {"4g.40gb": 1}}),
     FOUR_80, {1: GpuLayout(False), 3: GpuLayout(False), 0: GpuLayout(True, ("4g.40gb",))}),
    (entries({"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 1}}), {0: A100_80},
     {0: GpuLayout(True, ("3g.40gb",))}),
])
def test_expand(layout, gpus, expected):
    assert mig.expand(layout, gpus) == expected


@pytest.mark.parametrize("layout, gpus, message", [
    ("all-1g.5gb", {0: A100_80}, r"profile 1g\.5gb is not a MIG profile of GPU 0 \(NVIDIA A100 80GB PCIe\); its profiles are 1g\.10gb, "),
    ("all-3g.40gb", {0: A100_40}, r"profile 3g\.40gb is not a MIG profile of GPU 0"),
    ("all-3g.40gb", {0: "Tesla V100-PCIE-32GB"}, r"GPU 0 \(Tesla V100-PCIE-32GB\) has no known MIG profiles"),
    (entries({"devices": [0], "mig-enabled": True, "mig-devices": {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}}), FOUR_80,
     r"GPU 0: 4g\.40gb x1, 3g\.40gb x1, 1g\.10gb x1 needs 8 compute and 9 memory slices; a A100 80GB has 7 and 8"),
    (entries({"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2, "1g.10gb": 1}}), FOUR_80,
     r"needs 7 compute and 9 memory slices"),
    (entries({"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 3}}), FOUR_80,
     r"3 x 3g\.40gb on GPU 0: at most 2 fit one A100 80GB"),
    (entries({"devices": [4], "mig-enabled": True}), FOUR_80, r"GPU 4 not found \(GPUs present: 0, 1, 2, 3\)"),
    (entries({"devices": [0], "mig-enabled": True}, {"devices": "all", "mig-enabled": False}), FOUR_80,
     r"GPU 0 is named by two entries"),
    (entries({"devices": "all", "mig-enabled": False, "mig-devices": {"3g.40gb": 1}}), FOUR_80,
     r"mig-devices are given but mig-enabled is false"),
])
def test_expand_refuses(layout, gpus, message):
    with pytest.raises(MigLayoutError, match=message):
        mig.expand(layout, gpus)


def test_describe_and_canonical_order():
    model = mig.gpu_model(A100_80)
    assert mig.canonical(["1g.10gb", "3g.40gb", "2g.20gb", "1g.20gb"], model) == ("3g.40gb", "2g.20gb", "1g.20gb", "1g.10gb")
    assert mig.describe(("3g.40gb", "3g.40gb", "1g.10gb")) == "3g.40gb x2, 1g.10gb x1"
    assert mig.describe(()) == "none"


@pytest.mark.parametrize("name, model", [
    ("NVIDIA A100 80GB PCIe", "A100 80GB"), ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA H100 PCIe", "H100 80GB"), ("NVIDIA H100 80GB HBM3", "H100 80GB"), ("NVIDIA A30", "A30 24GB"),
    ("NVIDIA H100 NVL", "H100 94GB"), ("Tesla V100-SXM2-16GB", None),
])
def test_gpu_model(name, model):
    found = mig.gpu_model(name)
    assert (found.name if found else None) == model


# -- a runbook and fake executors --------------------------------------------------------------

RUNBOOK = """
hosts:
  - name: esx-01
    ssh: {{address: 10.0.0.11, user: root}}
    mig: {host_mig}
vms:
  - {{name: gpu-vm-01, host: esx-01}}
guests:
  hosts:
    - vm: gpu-vm-01
      ssh: {{address: 10.0.0.13, user: gpuadmin}}
      mig: {guest_mig}
"""


def cluster(tmp_path, fake: FakeExecutor, host_mig="all", guest_mig="all-3g.40gb"):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(RUNBOOK).format(host_mig=host_mig, guest_mig=guest_mig))
    return build_cluster(load_runbook(path), tmp_path, RemoteOptions(executor_factory=lambda name, access: fake))


def query(*rows: tuple[int, str, str]) -> str:
    return "".join(f"{i}, {A100_80}, {current}, {pending}\n" for i, current, pending in rows)


def lgi(*rows: tuple[int, str, int, int, int, int]) -> str:
    """The boxed `nvidia-smi mig -lgi` table (as the real tool prints it)."""
    bar = "+" + "-" * 55 + "+"
    head = [bar, "| GPU instances:                                        |",
            "| GPU   Name             Profile  Instance   Placement  |",
            "|                          ID       ID       Start:Size |", "|" + "=" * 55 + "|"]
    body = []
    for gpu, profile, pid, gid, start, size in rows:
        body += [f"|{gpu:>4}  MIG {profile:<13}{pid:>5}{gid:>9}{start:>11}:{size:<1}".ljust(56) + "|", bar]
    return "\n".join(head + body) + "\n"


def gpu(i: int, current="Disabled", pending=None, instances=(), name=A100_80) -> GpuMig:
    return GpuMig(i, name, current, pending or current, tuple(instances))


def plan_rows(changes):
    return [(c.resource, c.field, c.before, c.after, c.disruption) for c in changes]


# -- esxi.mig --------------------------------------------------------------------------------

def modes(*rows):
    return [MigMode(i, A100_80, current, pending) for i, current, pending in rows]


@pytest.mark.parametrize("host_mig, fact, expected", [
    ("all", modes((0, "Enabled", "Enabled"), (1, "Enabled", "Enabled")), []),
    ("[1]", modes((0, "Disabled", "Disabled"), (1, "Disabled", "Disabled")),
     [(f"GPU 1 ({A100_80})", "mig.mode", "Disabled", "Enabled", Disruption.HOST_REBOOT)]),
    ("all", modes((0, "Disabled", "Enabled"), (1, "Enabled", "Enabled")),
     [(f"GPU 0 ({A100_80})", "mig.mode", "Disabled (pending Enabled)", "Enabled (after reboot)", Disruption.HOST_REBOOT)]),
    ("all", modes((0, "Enabled", "Disabled")),
     [(f"GPU 0 ({A100_80})", "mig.mode", "Enabled (pending Disabled)", "Enabled", Disruption.NONE)]),
])
def test_esxi_plan(tmp_path, host_mig, fact, expected):
    c = cluster(tmp_path, FakeExecutor("esx-01"), host_mig=host_mig)
    changes = esxi_mig.plan(c.targets["esx-01"], fact)
    assert plan_rows(changes) == expected
    assert all(ch.step == "esxi.mig" and ch.target == "esx-01" for ch in changes)
    assert [ch.action is not None for ch in changes] == [not ch.after.endswith("(after reboot)") for ch in changes]


def test_esxi_plan_refuses_a_missing_gpu(tmp_path):
    c = cluster(tmp_path, FakeExecutor("esx-01"), host_mig="[0, 5]")
    with pytest.raises(InputError, match=r"rb\.yaml:5: hosts\[0\]\.mig: esxi\.mig: host esx-01: GPU 5 not found"):
        esxi_mig.plan(c.targets["esx-01"], modes((0, "Disabled", "Disabled")))


def test_esxi_apply_sets_and_reads_back(tmp_path):
    fake = FakeExecutor("esx-01", {
        "nvidia-smi -i 1 -mig 1": ok("", "Warning: MIG mode is in pending enable state for GPU 00000000:31:00.0:Not Supported\n"),
        re.compile(r"^nvidia-smi -i 1 --query-gpu"): ok("", query((1, "Disabled", "Enabled"))),
    })
    c = cluster(tmp_path, fake)
    changes = esxi_mig.plan(c.targets["esx-01"], modes((0, "Disabled", "Enabled"), (1, "Disabled", "Disabled")))
    esxi_mig.apply(Context(cluster=c), c.targets["esx-01"], changes)
    assert fake.commands == ["nvidia-smi -i 1 -mig 1",
                             "nvidia-smi -i 1 --query-gpu=index,name,mig.mode.current,mig.mode.pending --format=csv,noheader"]


def test_esxi_apply_fails_when_the_mode_does_not_stick(tmp_path):
    fake = FakeExecutor("esx-01", {"nvidia-smi -i 0 -mig 1": ok(""),
                                   re.compile(r"--query-gpu"): ok("", query((0, "Disabled", "Disabled")))})
    c = cluster(tmp_path, fake)
    changes = esxi_mig.plan(c.targets["esx-01"], modes((0, "Disabled", "Disabled")))
    with pytest.raises(RemoteCommandError, match=r"^GPU 0: MIG mode reads Disabled \(pending Disabled\)"):
        esxi_mig.apply(Context(cluster=c), c.targets["esx-01"], changes)


# -- guest.mig: observe -----------------------------------------------------------------------

def test_guest_observe_with_mig_off_does_not_list_instances(tmp_path):
    fake = FakeExecutor("gpu-vm-01", {re.compile("--query-gpu"): ok("", query((0, "Disabled", "Disabled"), (1, "Disabled", "Disabled"))),
                                      LGIP[0]: LGIP[1]})
    c = cluster(tmp_path, fake)
    assert [g.index for g in guest_mig.observe(Context(cluster=c), c.targets["gpu-vm-01"])] == [0, 1]
    assert fake.commands == [QUERY0.replace("-i 0 ", ""), "sudo -n nvidia-smi mig -lgip"]


def test_guest_observe_reads_instances(tmp_path):
    fake = FakeExecutor("gpu-vm-01", {
        re.compile("--query-gpu"): ok("", query((0, "Enabled", "Enabled"), (1, "Enabled", "Enabled"), (2, "Enabled", "Enabled"))),
        "nvidia-smi mig -lgi": ok("", (FIXTURES / "nvidia_smi_mig_lgi.txt").read_text()),
        LGIP[0]: LGIP[1],
    })
    c = cluster(tmp_path, fake)
    assert [(g.index, g.current, g.instances) for g in guest_mig.observe(Context(cluster=c), c.targets["gpu-vm-01"])] == [
        (0, "Enabled", ("3g.40gb", "3g.40gb")), (1, "Enabled", ("2g.20gb", "1g.10gb")), (2, "Enabled", ())]
    assert fake.calls[1].sudo


@pytest.mark.parametrize("code, text", [(6, "No GPU instances found: Not Found"), (6, "No MIG-enabled devices found.")])
def test_guest_observe_tolerates_no_instances(tmp_path, code, text):
    fake = FakeExecutor("gpu-vm-01", {re.compile("--query-gpu"): ok("", query((0, "Enabled", "Enabled"))),
                                      "nvidia-smi mig -lgi": CommandResult("", code, text + "\n", ""), LGIP[0]: LGIP[1]})
    c = cluster(tmp_path, fake)
    assert [g.instances for g in guest_mig.observe(Context(cluster=c), c.targets["gpu-vm-01"])] == [()]


def test_guest_observe_other_failures_raise(tmp_path):
    fake = FakeExecutor("gpu-vm-01", {re.compile("--query-gpu"): ok("", query((0, "Enabled", "Enabled"))),
                                      "nvidia-smi mig -lgi": CommandResult("", 4, "Insufficient Permissions\n", "")})
    c = cluster(tmp_path, fake)
    with pytest.raises(RemoteCommandError, match=r"gpu-vm-01: guest\.mig: `sudo -n nvidia-smi mig -lgi` exited 4"):
        guest_mig.observe(Context(cluster=c), c.targets["gpu-vm-01"])


# -- guest.mig: plan --------------------------------------------------------------------------

G0 = f"GPU 0 ({A100_80})"
PARTED = '[{devices: [0], mig-enabled: true, mig-devices: {"3g.40gb": 1, "2g.20gb": 2}}]'


@pytest.mark.parametrize("layout, fact, expected", [
    ("all-3g.40gb", (gpu(0),), [(G0, "mig.mode", "Disabled", "Enabled", Disruption.NONE),
                                (G0, "gpu instances", "none", "3g.40gb x2", Disruption.NONE)]),
    ("all-3g.40gb", (gpu(0, "Enabled", instances=["3g.40gb", "3g.40gb"]),), []),
    ("all-3g.40gb", (gpu(0, "Enabled", instances=["3g.40gb"]),),
     [(G0, "gpu instances", "3g.40gb x1", "3g.40gb x2", Disruption.NONE)]),
    ("all-disabled", (gpu(0, "Enabled", instances=["7g.80gb"]),),
     [(G0, "gpu instances", "7g.80gb x1", "none", Disruption.NONE), (G0, "mig.mode", "Enabled", "Disabled", Disruption.NONE)]),
    ("all-disabled", (gpu(0), gpu(1, "[N/A]", name="Tesla V100")), []),
    ("all-enabled", (gpu(0, "Enabled", instances=["1g.10gb"]),), [(G0, "gpu instances", "1g.10gb x1", "none", Disruption.NONE)]),
    ("all-3g.40gb", (gpu(0, "Disabled", "Enabled"),),
     [(G0, "mig.mode", "Disabled (pending Enabled)", "Enabled (GPU reset)", Disruption.VM_POWER_OFF),
      (G0, "gpu instances", "none", "3g.40gb x2", Disruption.NONE)]),
    (PARTED, (gpu(0, "Enabled", instances=["2g.20gb", "3g.40gb", "2g.20gb"]), gpu(1)), []),
    (PARTED, (gpu(0, "Enabled", instances=["3g.40gb", "3g.40gb"]), gpu(1)),
     [(G0, "gpu instances", "3g.40gb x2", "3g.40gb x1, 2g.20gb x2", Disruption.NONE)]),
])
def test_guest_plan(tmp_path, layout, fact, expected):
    c = cluster(tmp_path, FakeExecutor("gpu-vm-01"), guest_mig=layout)
    assert plan_rows(guest_mig.plan(c.targets["gpu-vm-01"], fact)) == expected


@pytest.mark.parametrize("layout, fact, message", [
    ("all-1g.5gb", (gpu(0),), r"rb\.yaml:12: guests\.hosts\[0\]\.mig: guest\.mig: guest gpu-vm-01: layout all-1g\.5gb: "
                               r"profile 1g\.5gb is not a MIG profile of GPU 0"),
    ('[{devices: all, mig-enabled: true, mig-devices: {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}}]', (gpu(0),),
     r"guest gpu-vm-01: layout mig-parted entries: GPU 0: .* needs 8 compute"),
    ("all-3g.40gb", (gpu(0, "[N/A]"),), r"GPU 0 \(NVIDIA A100 80GB PCIe\) reports MIG mode \[N/A\]"),
])
def test_guest_plan_refuses(tmp_path, layout, fact, message):
    c = cluster(tmp_path, FakeExecutor("gpu-vm-01"), guest_mig=layout)
    with pytest.raises(InputError, match=message):
        guest_mig.plan(c.targets["gpu-vm-01"], fact)


# -- guest.mig: apply -------------------------------------------------------------------------

class FakeGpu:
    """Just enough nvidia-smi for apply: mode, reset, instances on GPU 0."""

    def __init__(self, current="Disabled", pending=None, instances=(), sticks=True):
        self.current, self.pending, self.instances, self.sticks = current, pending or current, list(instances), sticks

    def responses(self):
        return {
            re.compile(r"-mig [01]$"): self.set_mode,
            re.compile(r"--gpu-reset"): self.reset,
            re.compile(r"--query-gpu"): lambda call: ok("", query((0, self.current, self.pending))),
            re.compile(r"mig -dci"): lambda call: ok("", "Successfully destroyed compute instance ID  0\n") if self.instances
            else CommandResult("", 6, "No compute instances found: Not Found\n", ""),
            re.compile(r"mig -dgi"): self.destroy,
            re.compile(r"mig -i 0 -cgi (\S+) -C"): self.create,
            LGIP[0]: LGIP[1],
            re.compile(r"mig -lgi( |$)"): lambda call: ok("", lgi(*[(0, p, 9, i + 1, 0, 4) for i, p in enumerate(self.instances)]))
            if self.instances else CommandResult("", 6, "No GPU instances found: Not Found\n", ""),
        }

    def set_mode(self, call):
        self.pending = "Enabled" if call.command.endswith("1") else "Disabled"
        if self.sticks:
            self.current = self.pending
        return ok("", "All done.\n")

    def reset(self, call):
        self.current = self.pending
        return ok("", "All done.\n")

    def destroy(self, call):
        self.instances = []
        return ok("", "Successfully destroyed GPU instance ID  1 from GPU  0\n")

    def create(self, call):
        self.instances += re.search(r"-cgi (\S+)", call.command)[1].split(",")
        return ok("", "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 3g.40gb (ID  9)\n")


def apply(tmp_path, layout, state: FakeGpu):
    fake = FakeExecutor("gpu-vm-01", state.responses())
    c = cluster(tmp_path, fake, guest_mig=layout)
    target = c.targets["gpu-vm-01"]
    changes = guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target))
    start = len(fake.calls)
    guest_mig.apply(Context(cluster=c), target, changes)
    return [call.line for call in fake.calls[start:]], guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target))


QUERY0 = "nvidia-smi -i 0 --query-gpu=index,name,mig.mode.current,mig.mode.pending --format=csv,noheader"


def test_guest_apply_enables_and_creates(tmp_path):
    commands, again = apply(tmp_path, "all-3g.40gb", FakeGpu())
    assert commands == ["sudo -n nvidia-smi -i 0 -mig 1", QUERY0, "sudo -n nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C",
                        QUERY0, "sudo -n nvidia-smi mig -lgi -i 0"]
    assert again == []


def test_guest_apply_replaces_instances(tmp_path):
    commands, again = apply(tmp_path, "all-3g.40gb", FakeGpu("Enabled", instances=["7g.80gb"]))
    assert commands[:3] == ["sudo -n nvidia-smi mig -dci -i 0", "sudo -n nvidia-smi mig -dgi -i 0",
                            "sudo -n nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C"]
    assert again == []


def test_guest_apply_disables_after_destroying(tmp_path):
    commands, again = apply(tmp_path, "all-disabled", FakeGpu("Enabled", instances=["3g.40gb"]))
    assert commands == ["sudo -n nvidia-smi mig -dci -i 0", "sudo -n nvidia-smi mig -dgi -i 0",
                        "sudo -n nvidia-smi -i 0 -mig 0", QUERY0]
    assert again == []


def test_guest_apply_pending_mode_stops_with_a_hint_then_resets(tmp_path):
    state = FakeGpu(sticks=False)
    fake = FakeExecutor("gpu-vm-01", state.responses())
    c = cluster(tmp_path, fake)
    target = c.targets["gpu-vm-01"]
    with pytest.raises(RemoteCommandError, match=r"^GPU 0: MIG mode Enabled is pending until the GPU "
                                                 r"is reset; apply again with --allow-power-off"):
        guest_mig.apply(Context(cluster=c), target, guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target)))
    assert not any("-cgi" in line for line in fake.commands)
    changes = guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target))
    assert changes[0].disruption == Disruption.VM_POWER_OFF
    guest_mig.apply(Context(cluster=c), target, changes)
    assert "sudo -n nvidia-smi --gpu-reset -i 0" in fake.commands
    assert guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target)) == []


def test_guest_apply_checks_what_was_made(tmp_path):
    state = FakeGpu()
    responses = state.responses()
    responses[re.compile(r"mig -i 0 -cgi (\S+) -C")] = lambda call: (state.instances.append("3g.40gb"), ok("", ""))[1]
    fake = FakeExecutor("gpu-vm-01", responses)
    c = cluster(tmp_path, fake)
    target = c.targets["gpu-vm-01"]
    with pytest.raises(RemoteCommandError, match=r"GPU 0: wanted 3g\.40gb x2 but nvidia-smi lists 3g\.40gb x1"):
        guest_mig.apply(Context(cluster=c), target, guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target)))


def test_root_login_needs_no_sudo(tmp_path):
    state = FakeGpu()
    fake = FakeExecutor("gpu-vm-01", state.responses())
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(RUNBOOK).format(host_mig="all", guest_mig="all-7g.80gb").replace("user: gpuadmin", "user: root"))
    c = build_cluster(load_runbook(path), tmp_path, RemoteOptions(executor_factory=lambda name, access: fake))
    target = c.targets["gpu-vm-01"]
    guest_mig.apply(Context(cluster=c), target, guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target)))
    assert not any(call.sudo for call in fake.calls)


def test_guest_apply_tries_other_orders_when_placement_fails(tmp_path):
    state = FakeGpu("Enabled")
    responses = state.responses()

    def first_fit(call):  # 3g.40gb made first takes slices 0-3, and the small ones no longer fit
        order = re.search(r"-cgi (\S+)", call.command)[1].split(",")
        if order[0] == "3g.40gb":
            state.instances += ["3g.40gb", "2g.20gb", "1g.10gb"]
            return CommandResult("", 2, "Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources\n"
                                        "Failed to create GPU instances: Insufficient Resources\n", "")
        state.instances += order
        return ok("", "")

    responses[re.compile(r"mig -i 0 -cgi (\S+) -C")] = first_fit
    fake = FakeExecutor("gpu-vm-01", responses)
    c = cluster(tmp_path, fake, guest_mig='[{devices: [0], mig-enabled: true, mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}]')
    target = c.targets["gpu-vm-01"]
    start = len(fake.calls)
    guest_mig.apply(Context(cluster=c), target, guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target)))
    assert [line for line in fake.commands[start:] if re.search(r" -(cgi|dci|dgi) ", line)] == [
        "sudo -n nvidia-smi mig -i 0 -cgi 3g.40gb,2g.20gb,1g.10gb,1g.10gb -C",
        "sudo -n nvidia-smi mig -dci -i 0", "sudo -n nvidia-smi mig -dgi -i 0",
        "sudo -n nvidia-smi mig -i 0 -cgi 3g.40gb,1g.10gb,1g.10gb,2g.20gb -C",
        "sudo -n nvidia-smi mig -dci -i 0", "sudo -n nvidia-smi mig -dgi -i 0",
        "sudo -n nvidia-smi mig -i 0 -cgi 2g.20gb,3g.40gb,1g.10gb,1g.10gb -C"]
    assert guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target)) == []


@pytest.mark.parametrize("code, text, message", [
    (2, "Failed to create GPU instances: Insufficient Resources", r"GPU 0: 3g\.40gb x2 does not fit \(nvidia-smi: Insufficient "
                                                                  r"Resources, 1 order\(s\) tried\)"),
    (4, "Unable to modify MIG configuration: Insufficient Permissions", r"GPU 0: `sudo -n nvidia-smi mig -i 0 -cgi 3g\.40gb,3g\.40gb -C` "
                                                                        r"exited 4: Unable to modify"),
])
def test_guest_apply_create_failures(tmp_path, code, text, message):
    state = FakeGpu("Enabled")
    responses = state.responses()
    responses[re.compile(r"mig -i 0 -cgi (\S+) -C")] = lambda call: CommandResult("", code, text + "\n", "")
    fake = FakeExecutor("gpu-vm-01", responses)
    c = cluster(tmp_path, fake)
    target = c.targets["gpu-vm-01"]
    with pytest.raises(RemoteCommandError, match=message):
        guest_mig.apply(Context(cluster=c), target, guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target)))


def test_guest_reset_failure_says_what_to_do(tmp_path):
    state = FakeGpu("Disabled", "Enabled")
    responses = state.responses()
    responses[re.compile(r"--gpu-reset")] = lambda call: CommandResult("", 255, "Unable to reset this GPU: In use by another client\n", "")
    fake = FakeExecutor("gpu-vm-01", responses)
    c = cluster(tmp_path, fake)
    target = c.targets["gpu-vm-01"]
    with pytest.raises(RemoteCommandError, match=r"gpu-vm-01: guest\.mig: GPU 0: `sudo -n nvidia-smi --gpu-reset -i 0` exited 255: "
                                                 r"Unable to reset this GPU: In use by another client; .* power-cycle the VM"):
        guest_mig.apply(Context(cluster=c), target, guest_mig.plan(target, guest_mig.observe(Context(cluster=c), target)))
