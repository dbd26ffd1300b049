"""The one home of gpuvm's jinja2 templates.

They are the source tree's top-level `templates/`, shipped as the package `gpuvm.templates`
(pyproject.toml maps one onto the other) and loaded as package resources, so a wheel and an
editable install (`pip install -e .`, as `make` sets up) find them the same way. A bare
PYTHONPATH=src does not map them: install the checkout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuvm.errors import GpuvmError

if TYPE_CHECKING:
    import jinja2

PACKAGE = "gpuvm.templates"


def environment(directory: str = "", sandboxed: bool = False, **options: Any) -> jinja2.Environment:
    """A jinja2 Environment over `templates/<directory>`; `options` as for jinja2.Environment.
    `sandboxed`: for templates users write (a runbook's command): jinja2's immutable sandbox, where
    `{{ cycler.__init__.__globals__.os.system(...) }}` is a SecurityError, not a command run here."""
    import jinja2
    import jinja2.sandbox

    try:
        loader = jinja2.PackageLoader(PACKAGE, directory or ".")
    except (ImportError, ValueError):
        where = f"{PACKAGE}/{directory}" if directory else PACKAGE
        raise GpuvmError(f"gpuvm's templates ({where}) are not installed: install gpuvm "
                         "(from a source checkout: pip install -e .)") from None
    kind = jinja2.sandbox.ImmutableSandboxedEnvironment if sandboxed else jinja2.Environment
    return kind(loader=loader, **options)
