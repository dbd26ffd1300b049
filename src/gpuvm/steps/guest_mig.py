"""guest.mig: MIG mode and GPU instances inside a guest with passthrough GPUs.

The runbook's `mig` (a named layout or mig-parted entries, see `gpuvm.mig`) is expanded per GPU
and checked against the profiles each GPU lists (`nvidia-smi mig -lgip`: ids, counts, memory); where
the driver lists none (MIG off on older drivers), against gpuvm's table for the GPU's name. Per GPU, the plan has at most a `mig.mode` change and one
`gpu instances` change; apply destroys the GPU's compute and GPU instances, then creates the
wanted ones with their default compute instance (`nvidia-smi mig -cgi ... -C`), and reads back.

Enabling MIG usually takes effect at once in a passthrough VM. Where it stays pending (the GPU is
in use, or the platform needs a reset) apply stops with an error; the next plan shows a GPU reset,
marked "needs VM power-off" because it ends every GPU process in the VM, as a power cycle would.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import islice, permutations
from typing import Any

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.mig import GpuLayout, GpuModel, MigLayoutError, canonical, describe, expand, gpu_model, model_for, reported_model
from gpuvm.parsers.nvidia_smi import (GpuInstance, GpuInstanceProfile, MigMode, parse_gpu_instance_profiles, parse_gpu_instances,
                                      parse_mig_query_csv)
from gpuvm.plan import Change, Disruption
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.remote import Cluster, run
from gpuvm.steps.base import Context, Step

NAME = "guest.mig"
QUERY = ["nvidia-smi", "--query-gpu=index,name,mig.mode.current,mig.mode.pending", "--format=csv,noheader"]
LGIP = ["nvidia-smi", "mig", "-lgip"]
NOTHING_THERE = ("No MIG-enabled devices found", "No GPU instances found", "No compute instances found")


@dataclass(frozen=True)
class GpuMig(MigMode):
    instances: tuple[str, ...] = ()  # GPU instance profiles, largest first
    profiles: tuple[GpuInstanceProfile, ...] = ()  # what `nvidia-smi mig -lgip` lists for this GPU


@dataclass(frozen=True)
class SetMigMode:
    gpu: int
    mode: str  # Enabled | Disabled
    reset: bool = False  # set before: a GPU reset makes it effective


@dataclass(frozen=True)
class SetInstances:
    gpu: int
    destroy: bool  # the GPU has instances now
    create: tuple[str, ...]  # GPU instance profiles, largest first


def wanted(target: DesiredGuest) -> bool:
    return target.mig is not None


def observe(ctx: Context, target: DesiredGuest) -> tuple[GpuMig, ...]:
    cluster = ctx.cluster
    modes = parse_mig_query_csv(run(target, cluster, QUERY).stdout)
    instances: dict[int, list[str]] = {}
    if any(m.current == "Enabled" for m in modes):
        for gi in _list_instances(target, cluster):
            instances.setdefault(gi.gpu, []).append(gi.profile)
    profiles = _list_profiles(target, cluster, modes) if _checks_profiles(target, modes) else {}
    return tuple(GpuMig(m.index, m.name, m.current, m.pending, canonical(instances.get(m.index, []), gpu_model(m.name)),
                        profiles.get(m.index, ())) for m in modes)


def _checks_profiles(target: DesiredGuest, modes: list[MigMode]) -> bool:
    return target.mig != "all-disabled" and any(m.current != "[N/A]" for m in modes)


def _list_profiles(target: DesiredGuest, cluster: Cluster, modes: list[MigMode]) -> dict[int, tuple[GpuInstanceProfile, ...]]:
    """Each GPU's profiles as `nvidia-smi mig -lgip` lists them (none where the driver lists none
    while MIG is off); output that is not a whole GPU's profiles is an error naming the guest."""
    result = run(target, cluster, LGIP, sudo=target.root, check=False)
    if result.exit_code != 0:
        if NOTHING_THERE[0] in result.stdout + result.stderr:
            return {}
        raise _failed(target, result)
    names = {m.index: m.name for m in modes}
    by_gpu: dict[int, list[GpuInstanceProfile]] = {}
    try:
        for row in parse_gpu_instance_profiles(result.stdout):
            by_gpu.setdefault(row.gpu, []).append(row)
        for gpu, rows in by_gpu.items():
            try:
                reported_model(names.get(gpu, f"GPU {gpu}"), rows)
            except MigLayoutError as e:
                raise RemoteCommandError(f"`{result.command}`: GPU {gpu}: {e}") from None
    except RemoteCommandError as e:
        raise RemoteCommandError(f"{target.name}: {NAME}: {e}") from None
    return {gpu: tuple(rows) for gpu, rows in by_gpu.items() if gpu in names}


def _list_instances(target: DesiredGuest, cluster: Cluster, gpu: int | None = None) -> list[GpuInstance]:
    argv = ["nvidia-smi", "mig", "-lgi"] + (["-i", str(gpu)] if gpu is not None else [])
    result = run(target, cluster, argv, sudo=target.root, check=False)
    if result.exit_code != 0 and not any(s in result.stdout + result.stderr for s in NOTHING_THERE):
        raise _failed(target, result)
    return parse_gpu_instances(result.stdout)


def _failed(target: DesiredGuest, result: CommandResult, gpu: int | None = None) -> RemoteCommandError:
    where = f"GPU {gpu}: " if gpu is not None else ""
    return RemoteCommandError(f"{target.name}: {NAME}: {where}`{result.command}` exited {result.exit_code}: "
                              f"{result.last_line or 'no output'}")


def plan(target: DesiredGuest, fact: tuple[GpuMig, ...]) -> list[Change]:
    """Per GPU the layout names: a mode change and/or an instance change. A layout that does not fit
    the GPUs found is an InputError at the guest's `mig` line."""
    mig = target.mig
    assert mig is not None
    try:
        reported = {g.index: reported_model(g.name, g.profiles) for g in fact if g.profiles}
        layouts = expand(mig, {g.index: g.name for g in fact}, reported)
        return [c for gpu in fact if gpu.index in layouts
                for c in _plan_gpu(target.name, gpu, layouts[gpu.index], model_for(gpu.name, reported.get(gpu.index)))]
    except MigLayoutError as e:
        label = mig if isinstance(mig, str) else "mig-parted entries"
        raise target.error(NAME, ("mig",), f"layout {label}: {e}") from None


def _plan_gpu(name: str, gpu: GpuMig, want: GpuLayout, model: GpuModel | None) -> list[Change]:
    resource = f"GPU {gpu.index} ({gpu.name})"
    mode = "Enabled" if want.enabled else "Disabled"
    if gpu.current == "[N/A]":  # the GPU (or this VM's view of it, e.g. a vGPU) has no MIG
        if want.enabled:
            raise MigLayoutError(f"GPU {gpu.index} ({gpu.name}) reports MIG mode [N/A]: MIG is not available here")
        return []
    have = canonical(gpu.instances, model) if gpu.current == "Enabled" else ()
    instances = None
    if have != want.profiles:
        instances = Change(NAME, name, resource, "gpu instances", describe(have), describe(want.profiles),
                           action=SetInstances(gpu.index, bool(have), tuple(want.profiles)))
    shown = gpu.current if gpu.pending == gpu.current else f"{gpu.current} (pending {gpu.pending})"
    mode_change = None
    if gpu.pending != mode:
        mode_change = Change(NAME, name, resource, "mig.mode", shown, mode, action=SetMigMode(gpu.index, mode))
    elif gpu.current != mode:  # set before; takes effect with a GPU reset
        mode_change = Change(NAME, name, resource, "mig.mode", shown, f"{mode} (GPU reset)", Disruption.VM_POWER_OFF,
                             SetMigMode(gpu.index, mode, reset=True))
    # instances are made after MIG is enabled, and go before it is disabled
    ordered = [mode_change, instances] if want.enabled else [instances, mode_change]
    return [c for c in ordered if c is not None]


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    cluster = ctx.cluster
    by_gpu: dict[int, dict[type, Any]] = {}
    for change in changes:
        by_gpu.setdefault(change.action.gpu, {})[type(change.action)] = change.action
    for gpu, todo in by_gpu.items():
        instances, mode = todo.get(SetInstances), todo.get(SetMigMode)
        if instances and instances.destroy:
            _destroy(target, cluster, gpu)
        if mode:
            _set_mode(target, cluster, gpu, mode.mode, reset=mode.reset)
        if instances and instances.create:
            _create(target, cluster, gpu, list(instances.create))


def _mode_of(target: DesiredGuest, cluster: Cluster, gpu: int) -> MigMode:
    return parse_mig_query_csv(run(target, cluster, QUERY[:1] + ["-i", str(gpu)] + QUERY[1:]).stdout)[0]


def _set_mode(target: DesiredGuest, cluster: Cluster, gpu: int, mode: str, reset: bool) -> None:
    if reset:
        result = run(target, cluster, ["nvidia-smi", "--gpu-reset", "-i", str(gpu)], sudo=target.root, check=False)
        if result.exit_code != 0:
            raise RemoteCommandError(f"{_failed(target, result, gpu)}; the GPU reset makes MIG mode {mode} effective: "
                                     "stop the GPU's processes or power-cycle the VM, then apply again")
    else:
        run(target, cluster, ["nvidia-smi", "-i", str(gpu), "-mig", "1" if mode == "Enabled" else "0"],
            sudo=target.root)
    now = _mode_of(target, cluster, gpu)
    if now.current != mode:
        raise RemoteCommandError(f"GPU {gpu}: MIG mode {mode} is pending until the GPU is "
                                 "reset; apply again with --allow-power-off to reset it, or reboot the VM")


def _destroy(target: DesiredGuest, cluster: Cluster, gpu: int) -> None:
    for flag in ("-dci", "-dgi"):  # compute instances first: a GPU instance in use cannot go
        result = run(target, cluster, ["nvidia-smi", "mig", flag, "-i", str(gpu)], sudo=target.root, check=False)
        if result.exit_code != 0 and not any(s in result.stdout + result.stderr for s in NOTHING_THERE):
            raise _failed(target, result, gpu)


def _create(target: DesiredGuest, cluster: Cluster, gpu: int, profiles: list[str]) -> None:
    """Create the instances. nvidia-smi puts each at its first free placement, so an order can fail
    where another fits (3g.40gb first takes slices 0-3; then 2g.20gb + 2 x 1g.10gb do not fit):
    like mig-parted, try the orders of the profiles, largest first, until one fits."""
    tried = 0
    for order in _orders(profiles):
        argv = ["nvidia-smi", "mig", "-i", str(gpu), "-cgi", ",".join(order), "-C"]
        result = run(target, cluster, argv, sudo=target.root, check=False)
        tried += 1
        if result.exit_code == 0:
            break
        if "Insufficient Resources" not in result.stdout + result.stderr:
            raise _failed(target, result, gpu)
        _destroy(target, cluster, gpu)  # what the failed order made
    else:
        raise RemoteCommandError(f"GPU {gpu}: {describe(profiles)} does not fit "
                                 f"(nvidia-smi: Insufficient Resources, {tried} order(s) tried)")
    model = gpu_model(_mode_of(target, cluster, gpu).name)
    made = canonical([gi.profile for gi in _list_instances(target, cluster, gpu)], model)
    if Counter(made) != Counter(profiles):  # the order of profiles a table does not know is by name
        raise RemoteCommandError(f"GPU {gpu}: wanted {describe(profiles)} "
                                 f"but nvidia-smi lists {describe(made)}")


def _orders(profiles: list[str], limit: int = 24):
    """Orders of the profile groups ("3g.40gb", "2g.20gb", "1g.10gb" x2 → 3 groups), the given one first."""
    groups = list(dict.fromkeys(profiles))
    for order in islice(permutations(groups), limit):
        yield [p for name in order for p in profiles if p == name]


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted)
