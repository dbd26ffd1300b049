"""NVIDIA vGPU guest licensing: what the runbook asks of a guest, the licence `nvidia-smi -q` reports,
and whether it is good enough to measure on. Shared by the guest.licensing step (plan, verify) and
`gpuvm bench run`, which refuses an unlicensed guest: an unlicensed vGPU is throttled and loses CUDA
after its grace period, so the figures would measure the licence, not the VM.

Facts from NVIDIA's "Virtual GPU Client Licensing User Guide" (Linux): the client configuration token
goes in /etc/nvidia/ClientConfigToken/ as client_configuration_token_*.tok with mode 744;
/etc/nvidia/gridd.conf sets `FeatureType` (1: NVIDIA vGPU, the licence picked from the vGPU type;
2: RTX Virtual Workstation and 4: Virtual Compute Server, for a passthrough GPU); nvidia-gridd is
restarted; `nvidia-smi -q` shows "vGPU Software Licensed Product" → "License Status".
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuvm.desired.ssh import GuestLicence
from gpuvm.errors import DriftError, InputError, RemoteCommandError
from gpuvm.files import KEY_BYTES, read_capped
from gpuvm.parsers.nvidia_smi_q import license_state, parse_nvidia_smi_q
from gpuvm.secrets import remember
from gpuvm.untrusted import checked

TOKEN_DIR = "/etc/nvidia/ClientConfigToken"
TOKEN_NAME = "client_configuration_token_gpuvm.tok"  # gpuvm's one token there (NVIDIA's pattern: client_configuration_token_*.tok)
TOKEN_MODE = 0o744  # the guide: the owner reads, writes and executes it; group and others read it
GRIDD_CONF = "/etc/nvidia/gridd.conf"
GRIDD_TEMPLATE = "/etc/nvidia/gridd.conf.template"  # the driver's; the guide starts gridd.conf from it
FEATURE_TYPES = {"vgpu": 1, "vws": 2, "vcs": 4}
QUERY = ["nvidia-smi", "-q"]
NO_DRIVER = 9  # nvidia-smi: "couldn't communicate with the NVIDIA driver"


def wanted_licence(runbook: Any, guest: Any) -> GuestLicence | None:
    """The one place that reads the runbook's licensing settings for a guest (`resolve_ssh` gives it
    to the guest's desired state; `bench run` checks it): None where the guest
    needs no licence (no `guests.licensing`, a VM without GPUs, or passthrough GPUs with
    `passthrough: none`, which a data-centre driver runs unlicensed)."""
    licensing = runbook.guests.licensing if runbook.guests is not None else None
    vm = next((v for v in runbook.vms if guest is not None and v.name == guest.vm), None)
    if licensing is None or vm is None or vm.gpus is None:
        return None
    if vm.gpus.mode == "vgpu":
        feature = FEATURE_TYPES["vgpu"]
    elif licensing.passthrough != "none":
        feature = FEATURE_TYPES[licensing.passthrough]
    else:
        return None
    path = licensing.token_file.expanduser()
    path = path if path.is_absolute() else runbook.file.parent / path
    return GuestLicence(path, feature, licensing.min_validity, licensing.acquire_timeout,
                         runbook.where(("guests", "licensing", "token_file")))


def read_token(want: GuestLicence) -> bytes:
    """The token's bytes, remembered as a secret (masked wherever gpuvm prints or records text)."""
    try:
        data = read_capped(want.token_file, KEY_BYTES, "client configuration token")
        remember(data.decode("ascii").strip(), want.where)
    except UnicodeDecodeError:
        raise InputError(f"{want.where}: {want.token_file} is not a client configuration token (not text)") from None
    except InputError as e:
        raise InputError(f"{want.where}: {e}") from None
    return data


def token_digest(want: GuestLicence) -> str:
    return hashlib.sha256(read_token(want)).hexdigest()


def shown_digest(digest: str) -> str:
    """How a plan shows a token: a digest prefix only, never its content."""
    return f"sha256:{digest[:12]}… (sensitive)"


@dataclass(frozen=True)
class Licence:
    status: str | None  # License Status as printed (the worst GPU's); None: nvidia-smi printed none
    licensed: bool
    expiry: datetime | None  # UTC; None: none printed (or not licensed)


def read_licence(executor: Any, sudo: bool = False, timeout: float = 60) -> Licence:
    """The guest's licence as `nvidia-smi -q` reports it; no nvidia-smi or no driver: unlicensed,
    status None. Every GPU must be licensed; the earliest expiry counts."""
    result = executor.run(QUERY, sudo=sudo, check=False, timeout=timeout)
    if result.exit_code in (127, NO_DRIVER) or "command not found" in result.stderr:
        return Licence(None, False, None)
    if not result.ok:
        raise RemoteCommandError(f"{executor.name}: `nvidia-smi -q` failed (exit {result.exit_code}): {result.last_line}")
    statuses = [checked(g.license_status, "a licence status", "nvidia-smi -q")
                for g in parse_nvidia_smi_q(result.stdout).gpus if g.license_status]
    if not statuses:
        return Licence(None, False, None)
    states = [(status, *license_state(status)) for status in statuses]
    unlicensed = [s for s in states if not s[1]]
    if unlicensed:
        return Licence(unlicensed[0][0], False, None)
    dated = sorted((s for s in states if s[2] is not None), key=lambda s: s[2])  # type: ignore[arg-type,return-value]
    first = dated[0] if dated else states[0]
    return Licence(first[0], True, first[2])


def licence_problem(licence: Licence, min_validity: float, now: datetime) -> str | None:
    """Why this licence is not good enough to measure on, or None."""
    return problem(licence.licensed, licence.status, expires_in(licence, now), min_validity)


def problem(licensed: bool, status: str | None, left: float | None, min_validity: float) -> str | None:
    """Why a licence (licensed or not, its status, seconds left) is not good enough, or None."""
    if not licensed:
        return f"unlicensed (License Status: {status or 'none reported by nvidia-smi -q'})"
    if left is not None and left < min_validity:
        return f"{status}: the licence ends within {duration(min_validity)}"
    return None


def expires_in(licence: Licence, now: datetime) -> float | None:
    return None if licence.expiry is None else (licence.expiry - now).total_seconds()


def duration(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} s"


def with_feature_type(text: str, feature: int) -> str:
    """gridd.conf's text with `FeatureType=<feature>`: the first setting replaced, later ones dropped,
    comments and every other line kept; appended when there is none."""
    lines, done = [], False
    for line in text.splitlines():
        if _is_feature_line(line):
            if not done:
                lines.append(f"FeatureType={feature}")
                done = True
            continue
        lines.append(line)
    if not done:
        lines.append(f"FeatureType={feature}")
    return "\n".join(lines) + "\n"


def feature_type(text: str | None) -> str | None:
    """gridd.conf's FeatureType (the last setting, as gridd reads it); None: no file or unset."""
    value = None
    for line in (text or "").splitlines():
        if _is_feature_line(line):
            value = line.split("=", 1)[1].split("#", 1)[0].strip().strip('"') or None
    return value if value is None or value.isdigit() else "(unreadable)"


def _is_feature_line(line: str) -> bool:
    key, sep, _ = line.strip().partition("=")
    return bool(sep) and key.strip() == "FeatureType"


def refuse_unlicensed(runbook: Any, executors: Mapping[str, Any], now: datetime) -> None:
    """`bench run`'s check before measuring: every guest taking part (`executors`, by VM name) that the
    runbook licenses must hold a licence valid for `min_validity`; else DriftError naming each."""
    problems = []
    for guest in runbook.guests.hosts if runbook.guests is not None else []:
        want = wanted_licence(runbook, guest) if guest.vm in executors else None
        if want is not None and (why := licence_problem(read_licence(executors[guest.vm]), want.min_validity, now)):
            problems.append(f"{guest.vm}: {why}")
    if problems:
        raise DriftError("refusing to benchmark: an unlicensed vGPU is throttled, so the figures would measure "
                         "the licence, not the VM (run `gpuvm apply`, or pass --allow-unlicensed):\n  "
                         + "\n  ".join(problems))
