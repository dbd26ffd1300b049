"""Read a runbook file: YAML with line numbers → typed `Runbook`, or one clear InputError.

ruamel.yaml keeps the line of every key and list item; pydantic's error locations are looked up
in that map, so every message reads `file:line: field.path: what is wrong`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from gpuvm.errors import InputError
from gpuvm.runbook.model import Runbook

Path_ = tuple[str | int, ...]


def field_path(loc: Path_) -> str:
    """('vms', 0, 'gpus', 'count') → 'vms[0].gpus.count'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _index_lines(node: Any, path: Path_, lines: dict[Path_, int]) -> None:
    if isinstance(node, CommentedMap):
        for key in node:
            try:
                line = node.lc.key(key)[0] + 1
            except (KeyError, TypeError):
                continue
            lines[path + (str(key),)] = line
            _index_lines(node[key], path + (str(key),), lines)
    elif isinstance(node, CommentedSeq):
        for index, item in enumerate(node):
            try:
                lines[path + (index,)] = node.lc.item(index)[0] + 1
            except (KeyError, TypeError):
                pass
            _index_lines(item, path + (index,), lines)


class Locator:
    """Maps a field path of the runbook to `file:line`."""

    def __init__(self, file: Path, lines: dict[Path_, int]):
        self.file = file
        self._lines = lines

    @classmethod
    def of(cls, file: Path, document: Any) -> "Locator":
        """The locator of a document ruamel.yaml loaded (round-trip), which knows its lines."""
        lines: dict[Path_, int] = {}
        _index_lines(document, (), lines)
        return cls(file, lines)

    def line(self, loc: Path_) -> int:
        # A missing or derived field has no line of its own: use its nearest parent's.
        for end in range(len(loc), 0, -1):
            if loc[:end] in self._lines:
                return self._lines[loc[:end]]
        return 1

    def where(self, loc: Path_) -> str:
        return f"{self.file}:{self.line(tuple(loc))}: {field_path(tuple(loc))}"

    def error(self, loc: Path_, message: str) -> InputError:
        return InputError(f"{self.where(tuple(loc))}: {message}")


def validation_message(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; see README 'Runbook')"
    if kind == "missing":
        return "required field is missing"
    message = error["msg"]
    return message.removeprefix("Value error, ")


def document_path(loc: tuple[Any, ...], data: Any, kind: str = "") -> Path_:
    """pydantic's error location as a path in the document: union tags (e.g. 'vgpu') dropped."""
    path: list[str | int] = []
    node = data
    for index, part in enumerate(loc):
        last = index == len(loc) - 1
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif not last or kind not in ("missing", "extra_forbidden"):
            continue  # a tag pydantic added, not a key the user wrote
        path.append(part)
    return tuple(path)


def load_runbook(path: str | Path) -> Runbook:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{file}: cannot read runbook: {e.strerror}") from None
    yaml = YAML(typ="rt")
    try:
        data = yaml.load(text)
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise InputError(f"{file}:{line}: YAML syntax error: {e.problem or e.context}") from None
    except Exception as e:  # ruamel raises a few unmarked errors (e.g. a control character)
        position = getattr(e, "position", None)
        line = text[:position].count("\n") + 1 if isinstance(position, int) else 1
        reason = str(e).splitlines()[-1].strip() if str(e).strip() else type(e).__name__
        raise InputError(f"{file}:{line}: YAML error: {reason}") from None
    if not isinstance(data, dict):
        raise InputError(f"{file}:1: (top level): a runbook is a mapping with vcenter, hosts and vms")
    locator = Locator.of(file, data)
    try:
        runbook = Runbook.model_validate(data)
    except ValidationError as e:
        messages = [f"{locator.where(document_path(err['loc'], data, err['type']))}: {validation_message(err)}" for err in e.errors()]
        raise InputError("\n".join(dict.fromkeys(messages))) from None
    runbook.attach(file, locator, text)
    runbook.check_references()
    return runbook
