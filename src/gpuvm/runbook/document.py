"""A YAML document with the line of every field: parsed, its fields located, pydantic's errors worded.

libyaml (fast_yaml) or ruamel.yaml keeps the line of every key and list item; pydantic's error
locations are looked up in that map, so every message reads `file:line: field.path: what is wrong`.
The runbook, the mig-parted config files it names and benchmark results are read with it.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from gpuvm.errors import InputError
from gpuvm.files import RUNBOOK_BYTES, read_capped
from gpuvm.runbook import fast_yaml

Path_ = tuple[str | int, ...]
MAX_BYTES = RUNBOOK_BYTES  # a runbook's text, at most (read_text)


FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def field_name(key: object) -> str:
    """A key as an error shows it: a name as written, anything else only by its length (an unknown
    key may be a line of a file that is no runbook, a password hash in /etc/shadow say)."""
    text = str(key)
    return text if FIELD_NAME.fullmatch(text) else f"<a key of {len(text)} characters>"


def field_path(loc: Path_) -> str:
    """('vms', 0, 'gpus', 'count') → 'vms[0].gpus.count'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{field_name(part)}" if out else field_name(part)
    return out or "(top level)"


MAX_NODES = 1_000_000  # values once YAML aliases are expanded (an alias bomb expands to billions)


class TooLarge(Exception):
    pass


def expanded_size(node: Any, memo: dict[int, int], parents: frozenset[int] = frozenset()) -> int:
    """How many values the document has once YAML aliases are expanded, counted without expanding
    them (an aliased value is the same object at each use). Refuses a value that contains itself."""
    if not isinstance(node, (dict, list)):
        return 1
    if id(node) in parents:
        raise TooLarge("a YAML alias refers to a value that contains it")
    if id(node) not in memo:
        children = node.values() if isinstance(node, dict) else node
        memo[id(node)] = 1 + sum(expanded_size(c, memo, parents | {id(node)}) for c in children)
    return memo[id(node)]


def _index_lines(node: Any, path: Path_, lines: dict[Path_, int]) -> None:
    """Every key's and item's line (an aliased value has lines at each use: see `expanded_size`)."""
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

    def __init__(self, file: Path, lines: dict[Path_, int], shown: dict[Path_, str] | None = None):
        self.file = file
        self._lines = lines
        self._shown = shown or {}  # VMs of a group: their place as the runbook writes it

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
        loc = tuple(loc)
        shown = self._shown.get(loc[:2])
        path = field_path(loc) if shown is None else shown + "".join(
            f"[{part}]" if isinstance(part, int) else f".{field_name(part)}" for part in loc[2:])
        return f"{self.file}:{self.line(loc)}: {path}"

    def error(self, loc: Path_, message: str) -> InputError:
        return InputError(f"{self.where(tuple(loc))}: {message}")


def validation_message(error: dict[str, Any], path: Path_ = ()) -> str:
    """pydantic's error in the runbook's words; `path`: where it is in the document (an unknown field's
    place, for the field spelt closest)."""
    kind = error["type"]
    if kind == "extra_forbidden":
        from gpuvm.runbook.spelling import closest_field

        meant = closest_field(path)
        hint = f"did you mean {meant}? " if meant else "check the spelling; "
        return f"unknown field ({hint}every field: docs/runbook.md, or `gpuvm schema runbook`)"
    if kind == "missing":
        return "required field is missing"
    message = error["msg"]
    return message.removeprefix("Value error, ")


# pydantic's "the value is not of this shape" errors: in a union, the shapes the user did not write
_OTHER_SHAPE = frozenset({"dict_type", "list_type", "model_type", "model_attributes_type", "literal_error",
                          "none_required", "string_type", "int_type", "bool_type", "float_type"})


def problems(errors: list[dict[str, Any]], data: Any) -> list[tuple[Path_, dict[str, Any]]]:
    """pydantic's errors with their paths in the document, less a union's other shapes: a field that
    may be a mapping or a list (guests.driver) and was written as a mapping with a bad key reports
    that key only, not also "Input should be a valid list". A value of no shape keeps them all."""
    placed = [(document_path(e["loc"], data, e["type"]), e) for e in errors]

    def of_the_shape_written(path: Path_, error: dict[str, Any]) -> bool:
        return any(other is not error and other_path[:len(path)] == path
                   and (len(other_path) > len(path) or other["type"] not in _OTHER_SHAPE)
                   for other_path, other in placed)

    return [(path, e) for path, e in placed if e["type"] not in _OTHER_SHAPE or not of_the_shape_written(path, e)]


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


def _without_values(problem: str | None) -> str:
    """A YAML error without the values it quotes (a duplicate key's: maybe a secret file's lines)."""
    problem = re.sub(r' with value ".*', "", problem or "", flags=re.S)
    return re.sub(r'key "([^"]*)"', lambda m: f'key "{field_name(m.group(1))}"', problem)


def read_text(file: Path) -> str:
    """The runbook's text: a regular file of at most MAX_BYTES, in UTF-8 (or UTF-16 with its BOM)."""
    raw = read_capped(file, MAX_BYTES, "runbook")
    encoding = "utf-16" if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig"
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise InputError(f"{file}:{line}: not {encoding.upper().removesuffix('-SIG')} text (byte "
                         f"0x{raw[e.start]:02x}); save the runbook as UTF-8") from None


def parse_document(file: Path, text: str) -> tuple[Any, Locator]:
    """The document and where each of its fields is: read by libyaml when it can (fast_yaml), else by
    ruamel's round-trip loader (anchors, tags, merge keys, and every YAML error's message)."""
    fast = fast_yaml.load(text)
    if fast is not None:
        data, lines = fast
        return data, Locator(file, lines)
    yaml = YAML(typ="rt")
    try:
        data = yaml.load(text)
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise InputError(f"{file}:{line}: YAML syntax error: {_without_values(e.problem or e.context)}") from None
    except Exception as e:  # ruamel raises a few unmarked errors (e.g. a control character)
        position = getattr(e, "position", None)
        line = text[:position].count("\n") + 1 if isinstance(position, int) else 1
        character = getattr(e, "character", None)
        reason = (f"character U+{character:04X} is not allowed in YAML (write it as an escape in a quoted string)"
                  if isinstance(character, int) else (str(e).splitlines() or [type(e).__name__])[0].strip())
        raise InputError(f"{file}:{line}: YAML error: {reason}") from None
    try:
        if expanded_size(data, {}) > MAX_NODES:
            raise TooLarge(f"the document expands to more than {MAX_NODES:,} values (YAML aliases?)")
    except (TooLarge, RecursionError) as e:
        raise InputError(f"{file}:1: {e if isinstance(e, TooLarge) else 'nested too deeply'}") from None
    return data, Locator.of(file, data)
