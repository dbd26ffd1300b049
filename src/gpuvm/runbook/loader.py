"""Read a runbook file: YAML with line numbers (`document.py`) → typed `Runbook`, or one clear
InputError naming `file:line: field.path`."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from gpuvm.errors import InputError
from gpuvm.runbook.document import Locator, Path_, parse_document, problems, read_text, validation_message
from gpuvm.runbook.groups import expand_vm_groups
from gpuvm.runbook.mig_parted import resolve_mig_files
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.setups import setup_runbooks
from gpuvm.runbook.slurm import check_slurm
from gpuvm.secrets import remember_runbook_secrets

def load_runbook(path: str | Path, text: str | None = None) -> Runbook:
    """The runbook at `path`; `text`: its `read_text`, when already read (gpuvm/read_ahead.py)."""
    file = Path(path)
    text = read_text(file) if text is None else text
    data, locator = parse_document(file, text)
    if not isinstance(data, dict):
        raise InputError(f"{file}:1: (top level): a runbook is a mapping with vcenter, hosts and vms")
    if (kind := str(data.get("schema", ""))).startswith("gpuvm."):  # a document gpuvm printed or saved
        hint = " (a saved plan: gpuvm show it, gpuvm apply it)" if kind.startswith("gpuvm.saved-plan/") else ""
        raise InputError(f"{file}:1: a {kind[:40]} document, not a runbook{hint}")
    # a VM group becomes its VMs, which keep the group's lines (runbook/groups.py)
    locator = Locator(file, *expand_vm_groups(data, locator._lines, locator.error))
    resolve_mig_files(data, file, locator.error)  # a guest's mig-parted config file → its entries
    try:
        runbook = Runbook.model_validate(data)
    except ValidationError as e:
        messages = [f"{locator.where(path)}: {validation_message(err, path)}" for path, err in problems(e.errors(), data)]
        raise InputError("\n".join(dict.fromkeys(messages))) from None
    runbook.attach(file, locator, text)
    runbook = runbook.check_references()  # qualified: a name used in several vCenters is <vcenter>/<name> from here on
    check_slurm(runbook)
    setup_runbooks(runbook)  # each setup of the campaign checked as a runbook of its own
    try:
        remember_runbook_secrets(runbook)
    except InputError as e:  # a secret too short to mask: name its line
        field = str(e).split(" ", 1)[0].split("(")[0]
        raise InputError(f"{file}:{locator.line(_dotted(field))}: {e}") from None
    return runbook


def _dotted(field: str) -> Path_:
    """'guests.hosts[0].ssh.passphrase_env' → ('guests', 'hosts', 0, 'ssh', 'passphrase_env')."""
    parts: list[str | int] = []
    for word in field.replace("]", "").split("."):
        name, *indices = word.split("[")
        if name:
            parts.append(name)
        parts += [int(i) for i in indices if i.isdigit()]
    return tuple(parts)
