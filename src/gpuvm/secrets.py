"""Secrets read from the environment, and the one place that scrubs them from text.

Every password or passphrase gpuvm reads goes through `secret_from_env`, which remembers the
value; `redact` replaces every remembered value in a string. Logs, plans, journals, reports and
error messages pass their text through `redact` before it leaves the process.

Order matters: a secret holding `"`, `\\` or non-ASCII changes form once encoded (JSON writes
`\\"` and `\\u00e9`, repr doubles backslashes), so structured output is scrubbed on its values
first (`scrub`), then encoded. `redact` also masks each secret's encoded forms (JSON, repr,
unicode-escaped, percent- and HTML-escaped), for text already encoded before it reached gpuvm (a
vSphere fault's dump repr-escapes its message). `guard_output` puts the same masking on log
records and on the traceback of an unexpected error.
"""

from __future__ import annotations

import enum
import html
import json
import logging
import os
import re
import sys
import threading
import traceback
import typing
from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from gpuvm.errors import InputError

_lock = threading.Lock()
_known: set[str] = set()
_pattern: re.Pattern[str] | None = None  # every form of every secret, longest first; None: no secrets

MASK = "********"
MIN_LENGTH = 6  # a shorter secret cannot be masked without garbling other text (`tim********`)


def remember(value: str | None, where: str = "a secret") -> str | None:
    """Mark a value as secret so that `redact` hides it wherever it appears; refuse one too short
    to hide safely (`where` names where it came from)."""
    if value:
        if len(value) < MIN_LENGTH:
            raise InputError(f"{where}: the secret is shorter than {MIN_LENGTH} characters; gpuvm could not "
                             "mask it in its output without garbling other text: use a longer one")
        with _lock:
            if value not in _known:
                _known.add(value)
                _compile()
    return value


def _forms(secret: str) -> set[str]:
    """The ways `secret` can be written once encoded: as is, JSON-escaped (ASCII or not), as
    Python's repr writes it, unicode-escaped (`shown`), percent-encoded (URLs), HTML-escaped (the
    HTML report); and each of those JSON-escaped again."""
    def escaped(text: str) -> set[str]:
        return {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]}

    once = {secret, *escaped(secret), repr(secret)[1:-1], secret.encode("unicode_escape").decode("ascii"),
            quote(secret, safe=""), html.escape(secret), _markup_escape(secret)}
    twice = set().union(*(escaped(form) for form in once))  # a repr inside JSON, JSON inside JSON
    return {form for form in once | twice if len(form) >= MIN_LENGTH}


def _markup_escape(text: str) -> str:
    """HTML-escaped as Jinja's autoescape (markupsafe) writes it (`&#34;`, not html's `&quot;`)."""
    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&#34;"), ("'", "&#39;")):
        text = text.replace(char, entity)
    return text


def _compile() -> None:
    """One pattern for every form of every secret (called under the lock)."""
    global _pattern
    forms = sorted(set().union(*(_forms(s) for s in _known)), key=len, reverse=True)
    _pattern = re.compile("|".join(map(re.escape, forms))) if forms else None


def is_secret(value: str) -> bool:
    """Whether `value` contains a remembered secret."""
    with _lock:
        return any(secret in value for secret in _known)


def secret_from_env(variable: str, where: str) -> str:
    """The value of environment variable `variable`; `where` names the runbook field asking."""
    value = os.environ.get(variable)
    if not value:
        raise InputError(f"{where}: environment variable {variable} is not set (it holds the secret)")
    return remember(value, f"{where} ({variable})")  # type: ignore[return-value]


def remember_runbook_secrets(model: object) -> None:
    """Every secret a runbook names (its `*_env` fields whose variables are set), and govc's
    password, remembered at load: whichever command runs, none of them reaches a file or output.
    Only the fields whose type can hold such a field are walked (`_secret_fields`): not the
    thousands of VM entries of a fleet's runbook, which have none."""
    from pydantic import BaseModel

    def walk(value: object, where: tuple[str, ...]) -> None:
        if isinstance(value, BaseModel):
            for name in _secret_fields(type(value)):
                field = getattr(value, name)
                if name.endswith("_env") and isinstance(field, str) and os.environ.get(field):
                    remember(os.environ[field], f"{''.join(where + ('.' + name,)).lstrip('.')} ({field})")
                elif not isinstance(field, (str, int, float)) and field is not None:  # scalars hold no model
                    walk(field, where + ("." + name,))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, where + (f"[{i}]",))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, where + (f".{key}",))

    walk(model, ())
    if os.environ.get("GOVC_PASSWORD"):
        remember(os.environ["GOVC_PASSWORD"], "GOVC_PASSWORD")


_SECRET_FIELDS: dict[type, tuple[str, ...]] = {}
_NO_MODEL = (str, bytes, int, float, bool, type(None))


def _secret_fields(kind: type) -> tuple[str, ...]:
    """A model class's fields that are `*_env` or whose annotated type can hold a model that has
    one, read from the annotations once per class. A type it cannot read (Any, a plain object) is
    walked."""
    if kind not in _SECRET_FIELDS:
        _SECRET_FIELDS[kind] = tuple(kind.model_fields)  # meanwhile (a model that holds itself): walk all
        _SECRET_FIELDS[kind] = tuple(name for name, info in kind.model_fields.items()
                                     if name.endswith("_env") or _may_hold_secret(info.annotation))
    return _SECRET_FIELDS[kind]


def _may_hold_secret(annotation: object) -> bool:
    from pydantic import BaseModel

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return False
    if origin is typing.Annotated:  # Annotated[X, validators...]: X
        return _may_hold_secret(args[0])
    if args:  # list[X], X | None, dict[str, X]
        return any(_may_hold_secret(arg) for arg in args)
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return bool(_secret_fields(annotation))
        return not issubclass(annotation, (*_NO_MODEL, enum.Enum, PurePath))
    return annotation is not Ellipsis


def redact(text: str) -> str:
    """`text` with every form of every remembered secret masked."""
    pattern = _pattern
    return text if pattern is None else pattern.sub(MASK, text)


def scrub(value: Any) -> Any:
    """`value` with every secret masked in every string it holds, for encoding next (JSON, YAML, a
    log line): dicts (keys too), lists, tuples and sets walked; numbers, booleans and None kept;
    anything else (exceptions, paths, dates) as its scrubbed text, what `json.dumps(default=str)`
    would have written."""
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [scrub(item) for item in value]
    return redact(str(value))


class _RedactingFilter(logging.Filter):
    """Masks secrets in a log record's values before they are formatted into its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, dict):
            record.args = {k: _loggable(v) for k, v in record.args.items()}
        elif record.args:
            record.args = tuple(_loggable(a) for a in record.args)
        return True


def _loggable(value: Any) -> Any:
    """A log argument with its secrets masked; numbers stay numbers (`%d`)."""
    return value if value is None or isinstance(value, (bool, int, float)) else scrub(value)


class _RedactingFormatter(logging.Formatter):
    """The formatted line masked again: a traceback (`exc_info`) is text only the formatter makes."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        from gpuvm.untrusted import printable  # a host's text in a log line: no terminal control

        return printable(redact(self.inner.format(record)))


def guard_output() -> None:
    """Mask secrets in everything this process prints outside gpuvm's own messages: log records
    (every handler of the root logger) and the tracebacks of unexpected errors, in the main thread
    and in others. Called once by the CLI, after logging is configured."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _RedactingFilter) for f in handler.filters):
            handler.addFilter(_RedactingFilter())
            handler.setFormatter(_RedactingFormatter(handler.formatter))

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))

    def thread_excepthook(args: Any) -> None:
        if args.exc_type is not SystemExit:
            name = args.thread.name if args.thread else "a thread"
            sys.stderr.write(f"Exception in {name}:\n"
                             + redact("".join(traceback.format_exception(args.exc_type, args.exc_value,
                                                                         args.exc_traceback))))

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook


def without_password(url: str) -> str:
    """`url` with the password of its user info masked (`https://user:***@host/sdk`), for
    messages about a URL that may be malformed in any other way (so no URL parser is trusted:
    the user info is everything before the last `@`)."""
    scheme, sep, rest = url.partition("://") if "://" in url else ("", "", url)
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"
