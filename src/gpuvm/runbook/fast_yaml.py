"""A runbook's YAML read by libyaml's C parser, with the line of every key and list item.

ruamel.yaml's round-trip loader, whose line numbers the runbook's errors name, is pure Python:
about 6 s for a runbook of 4,096 VMs. libyaml (PyYAML's C parser) reads the same text in well under
a tenth of that; this module builds plain dicts and lists from its events and resolves each plain
scalar with ruamel's own resolver and constructor (YAML 1.2: `off` is a string, `017` is 17), so
the data is what ruamel gives. Only the plain shape runbooks have is read here: a document with
anything else (a tag, an anchor or alias, a merge key, a key that is not a string, a key given twice,
a %YAML directive, several documents) or one libyaml refuses gives None, and the loader reads it
with ruamel, whose data and messages stand.
"""

from __future__ import annotations

import itertools
from typing import Any

Path_ = tuple[str | int, ...]
Lines = dict[Path_, int]


class _Unusual(Exception):
    """The document needs ruamel's full loader."""


def load(text: str) -> tuple[Any, Lines] | None:
    """(data, line of every key and item path) as ruamel's round-trip loader reads them, or None."""
    if (yaml := _libyaml()) is None:
        return None
    try:
        return _Builder().build(yaml.parse(text, Loader=yaml.CSafeLoader))
    except (_Unusual, yaml.YAMLError, RecursionError):
        return None


def top_value(text: str, *keys: str, within: int = 2_000) -> tuple[str, Any] | None:
    """(key, value) of the first of the document's top-level `keys`, as `load` reads it, from the
    document's first `within` events only; None when none is among them (or the document is not as
    `load` reads)."""
    if (yaml := _libyaml()) is None:
        return None
    builder = _Builder()
    events = itertools.islice(yaml.parse(text, Loader=yaml.CSafeLoader), within)
    try:
        if [type(e).__name__ for e in _take(events, 3)] != ["StreamStartEvent", "DocumentStartEvent",
                                                            "MappingStartEvent"]:
            return None
        for event in events:
            if type(event) is not builder._scalar_event:
                return None  # the mapping's end, or a key that is not a string
            name = builder._node(event, events, ())
            value = builder._node(next(events), events, (name,))
            if name in keys:
                return name, value
    except (_Unusual, yaml.YAMLError, RecursionError, StopIteration):
        return None
    return None


def _libyaml() -> Any:
    """PyYAML, when it has libyaml's C parser (None: the documents go to ruamel)."""
    try:
        import yaml
    except ImportError:
        return None
    return yaml if getattr(yaml, "__with_libyaml__", False) else None


class _Builder:
    def __init__(self) -> None:
        from ruamel.yaml import YAML
        from yaml import events

        ruamel = YAML(typ="rt")
        self._resolver, self._constructor = ruamel.resolver, ruamel.constructor
        self._plain: dict[str, Any] = {}  # plain scalar text → its value (runbooks repeat values a lot)
        # the first characters ruamel's resolver tries a type for (bool, null, number, date…): a plain
        # scalar starting otherwise is a string, as ruamel resolves it, without asking it (most names)
        resolved = self._resolver.versioned_resolver
        self._typed = set(resolved) if None not in resolved and not self._resolver.yaml_path_resolvers else None
        self._scalar_event, self._sequence_start, self._sequence_end = (
            events.ScalarEvent, events.SequenceStartEvent, events.SequenceEndEvent)
        self._mapping_start, self._mapping_end = events.MappingStartEvent, events.MappingEndEvent
        self.lines: Lines = {}

    def build(self, events: Any) -> tuple[Any, Lines]:
        events = iter(events)
        start = _take(events, 2)
        if [type(e).__name__ for e in start] != ["StreamStartEvent", "DocumentStartEvent"]:
            raise _Unusual  # an empty stream: ruamel says what a runbook should be
        if start[1].version or start[1].tags:
            raise _Unusual  # %YAML or %TAG directives
        data = self._node(next(events), events, ())
        if [type(e).__name__ for e in events] != ["DocumentEndEvent", "StreamEndEvent"]:
            raise _Unusual  # several documents
        return data, self.lines

    def _node(self, event: Any, events: Any, path: Path_) -> Any:
        kind = type(event)
        if kind is self._scalar_event:
            if event.anchor is not None or event.tag is not None:
                raise _Unusual
            return self._scalar(event)
        if event.anchor is not None or getattr(event, "tag", None) is not None:  # an alias has no tag: its anchor is set
            raise _Unusual
        lines = self.lines
        if kind is self._sequence_start:
            items: list[Any] = []
            end = self._sequence_end
            for event in events:
                if type(event) is end:
                    return items
                item = path + (len(items),)
                lines[item] = event.start_mark.line + 1
                items.append(self._node(event, events, item))
        if kind is self._mapping_start:
            mapping: dict[str, Any] = {}
            end, scalar = self._mapping_end, self._scalar_event
            for event in events:
                if type(event) is end:
                    return mapping
                key = self._node(event, events, path) if type(event) is scalar else None
                if not isinstance(key, str) or key in mapping or key == "<<":
                    raise _Unusual  # a complex, non-string, repeated or merge key
                item = path + (key,)
                lines[item] = event.start_mark.line + 1
                mapping[key] = self._node(next(events), events, item)
        raise _Unusual  # a document start inside a node cannot happen; the end of the events can

    def _scalar(self, event: Any) -> Any:
        if not event.implicit[0]:
            return event.value  # quoted or block: a string
        value = event.value
        if self._typed is not None and value and value[0] not in self._typed:
            return value
        try:
            return self._plain[value]
        except KeyError:
            from ruamel.yaml.nodes import ScalarNode

            tag = self._resolver.resolve(ScalarNode, event.value, (True, False))
            try:
                value = self._constructor.construct_object(ScalarNode(tag, event.value), deep=True)
            except Exception:  # e.g. a date that does not exist: ruamel words it
                raise _Unusual from None
            self._plain[event.value] = value
            return value


def _take(events: Any, count: int) -> list[Any]:
    return [e for _, e in zip(range(count), events)]
