"""NVIDIA mig-parted config files as a guest's MIG layout: `mig: {config_file: F, config: NAME}`.

mig-parted (what DeepOps and the GPU Operator's mig-manager apply) reads

    version: v1
    mig-configs:
      all-1g.10gb:
        - devices: all            # or [0, 1]
          mig-enabled: true
          mig-devices: {"1g.10gb": 7}

The loader replaces the reference with the entries of the named config, checked here, before the
runbook is validated: errors in the file name the file's own line and field, errors in the
reference the runbook's. Only the chosen config is read (a file holds configs for other GPUs).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from gpuvm.errors import InputError
from gpuvm.runbook.document import document_path, parse_document, validation_message
from gpuvm.runbook.guests import MigConfigFile, MigDevices
from gpuvm.runbook.strict import shown

Where = tuple[str | int, ...]


def resolve_mig_files(data: Any, runbook_file: Path, error: Callable[[Where, str], InputError]) -> None:
    """Every `guests.hosts[i].mig` that references a file, replaced (in `data`) by that config's entries."""
    guests = data.get("guests") if isinstance(data, dict) else None
    hosts = guests.get("hosts") if isinstance(guests, dict) else None
    for index, guest in enumerate(hosts if isinstance(hosts, list) else []):
        mig = guest.get("mig") if isinstance(guest, dict) else None
        if isinstance(mig, dict) and "config_file" in mig:
            where: Where = ("guests", "hosts", index, "mig")
            guest["mig"] = [entry.model_dump(by_alias=True, exclude_none=True)
                            for entry in _entries(_reference(mig, where, error), runbook_file, where, error)]


MAX_BYTES = 1 << 20  # mig-parted's own example file, every GPU's configs, is about 20 KB


def _read(path: Path, error: Callable[[str], InputError]) -> str:
    """The file's text: a regular file (a FIFO must not block, /dev/zero not be read whole) of at
    most MAX_BYTES, UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise error(f"{path}: not a regular file (a mig-parted config is a YAML file)")
            raw = stream.read(MAX_BYTES + 1)
    except OSError as e:
        raise error(f"cannot read the mig-parted config file {path}: {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise error(f"{path}: larger than {MAX_BYTES >> 20} MB; a mig-parted config file is far smaller")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None


def _reference(mig: dict, where: Where, error: Callable[[Where, str], InputError]) -> MigConfigFile:
    try:
        return MigConfigFile.model_validate(dict(mig))
    except ValidationError as e:
        first = e.errors()[0]
        raise error(where + document_path(first["loc"], mig, first["type"]), validation_message(first)) from None


def _entries(ref: MigConfigFile, runbook_file: Path, where: Where,
             error: Callable[[Where, str], InputError]) -> list[MigDevices]:
    path = Path(ref.config_file)
    path = path if path.is_absolute() else runbook_file.parent / path
    data, locator = parse_document(path, _read(path, lambda message: error(where + ("config_file",), message)))
    if not isinstance(data, dict) or "mig-configs" not in data:
        raise locator.error((), "not a mig-parted config file (expected `version: v1` and `mig-configs:`)")
    if data.get("version") != "v1":
        found = "no version" if "version" not in data else f"version {shown(data['version'])}"
        raise locator.error(("version",), f"mig-parted config file with {found}; gpuvm reads `version: v1`")
    configs = data["mig-configs"]
    if not isinstance(configs, dict) or not configs:
        raise locator.error(("mig-configs",), "expected a mapping of config names to lists of entries")
    if ref.config not in configs:
        names = ", ".join(str(name) for name in configs)
        raise error(where + ("config",), f"{shown(ref.config)} is not a config of {path} (its configs: {names})")
    entries = configs[ref.config]
    at: Where = ("mig-configs", ref.config)
    if not isinstance(entries, list) or not entries:
        raise locator.error(at, "expected a list of entries (devices, mig-enabled, mig-devices)")
    checked = []
    for number, entry in enumerate(entries):
        try:
            checked.append(MigDevices.model_validate(dict(entry) if isinstance(entry, dict) else entry))
        except ValidationError as e:
            first = e.errors()[0]
            loc = at + (number,) + document_path(first["loc"], entry, first["type"])
            raise locator.error(loc, validation_message(first)) from None
    return checked
