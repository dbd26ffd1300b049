"""Progress lines for long calls: a blocking call (a `docker build` of half an hour, a 2 GB `docker
save` / `docker load`) says how far it got every few seconds instead of nothing for minutes.

`Ticker(say, text)` calls `say(text(elapsed))` every `every` seconds from a thread while the block
runs; `Counted` wraps a binary sink or counts chunks so the text can name bytes and rate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import BinaryIO

EVERY = 10.0  # seconds between progress lines (a step under this says only done / failed)


def amount(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def rate(size: int, seconds: float) -> str:
    """`1.2 GB in 14 s (85.7 MB/s)`."""
    return f"{amount(size)} in {seconds:.0f} s ({amount(size / max(seconds, 0.001))}/s)"


class Ticker:
    """`with Ticker(say, lambda s: f"building: {s:.0f} s"):` — a line every `every` seconds."""

    def __init__(self, say: Callable[[str], None], text: Callable[[float], str], every: float | None = None):
        self.say, self.text, self.every = say, text, EVERY if every is None else every
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpuvm-ticker")

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.say(self.text(self.elapsed))
            except Exception:  # noqa: BLE001 - a progress line never breaks the work it reports on
                pass

    def __enter__(self) -> Ticker:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=1)


class Counted:
    """A binary sink that counts what goes through it (stdout_to= of a `docker save`)."""

    def __init__(self, sink: BinaryIO | None = None):
        self.sink, self.bytes = sink, 0

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        return self.sink.write(data) if self.sink is not None else len(data)

    def add(self, size: int) -> None:
        self.bytes += size

    def flush(self) -> None:
        if self.sink is not None:
            self.sink.flush()
