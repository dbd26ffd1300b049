"""The gpuvm process (the console script, `python -m gpuvm`): SIGINT and SIGTERM are handled before
anything else loads, so that either ends the process with one status at every moment of a run:
128 + its number (130, 143), as a shell reports a process the signal ended. While a command runs,
gpuvm.cli.common handles them (the run unwinds, its end journaled); before that (while gpuvm loads
and parses its arguments) and after, nothing is under way and the process ends at once."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from gpuvm.errors import error_document


def _end(signum: int, frame: Any) -> None:
    """Ends the process, saying so on stderr and, given --json, on stdout as a gpuvm.error/1 document."""
    message = f"interrupted by {signal.Signals(signum).name}"
    documents = sys.modules.get("gpuvm.documents")  # loaded: it knows whether the command's own document was printed
    document = (documents.error_json(message, 128 + signum, "interrupted") if documents else
                json.dumps(error_document(message, 128 + signum, "interrupted"), ensure_ascii=False))
    if "--json" in sys.argv[1:] and document is not None:
        os.write(1, (document + "\n").encode())
    os.write(2, f"error: {message}\n".encode())
    raise SystemExit(128 + signum)


def main() -> Any:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _end)
    from gpuvm.cli.main import app

    return app()
