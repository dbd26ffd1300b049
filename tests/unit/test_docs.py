"""The README is a door, docs/ the house (issue 23): the README stays short and keeps the two commands
CI runs; every command and flag is documented under docs/; every link leads somewhere; and every
runbook the docs show is one the schema accepts and `validate` passes (unless marked a part of one)."""

from __future__ import annotations

import functools
import itertools
import json
import re
from pathlib import Path

import pytest
import typer
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from gpuvm.cli.main import app

REPO = Path(__file__).parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
COMMAND_DOCS = [REPO / "docs" / "guide.md", REPO / "docs" / "benchmarks.md"]
MAX_README_LINES = 250


def test_the_readme_is_short_and_its_two_commands_are_the_ones_ci_and_make_run():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES, "move reference material into docs/"
    quick_start = re.search(r"## Quick start\n.*?```sh\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in quick_start.splitlines()]
    assert commands == ["make demo", "make test"]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "make test" in ci, ".ci/run must run the README's test command"
    targets = re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), re.M)
    assert {"demo", "test"} <= set(targets)


def _commands(command, path=()):  # typer's click command tree: (path, command) of every leaf
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, command


COMMANDS = list(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_and_flag_is_documented_under_docs(path, command):
    documented = "\n".join(doc.read_text(encoding="utf-8") for doc in COMMAND_DOCS)
    assert f"gpuvm {' '.join(path)}" in documented, "document it in docs/guide.md or docs/benchmarks.md"
    flags = [opt for param in command.params for opt in param.opts if opt.startswith("--") and opt != "--help"]
    missing = [flag for flag in flags if not re.search(rf"{re.escape(flag)}(?![\w-])", documented)]
    assert not missing, f"gpuvm {' '.join(path)}: flags not in docs/guide.md or docs/benchmarks.md: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = doc.read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)
    return {_slug(h) for h in headings} | set(re.findall(r'<a id="([^"]+)">', text))


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_and_heading(doc: Path):
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        where = (doc.parent / file).resolve() if file else doc
        assert where.exists(), f"{doc.name}: link to {target}: no such file"
        if anchor and where.suffix == ".md":
            assert anchor in _anchors(where), f"{doc.name}: link to {target}: no such heading"


@functools.cache
def _validator() -> Draft202012Validator:
    shipped = REPO / "src" / "gpuvm" / "schemas" / "runbook.json"
    return Draft202012Validator(json.loads(shipped.read_text(encoding="utf-8")))


def _runbooks_shown() -> list[tuple[str, str]]:
    """The YAML blocks of the README and docs/ that are whole runbooks (they start at a top-level key)."""
    found = []
    for doc in [README, *DOCS]:
        for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            if re.match(r"(#.*\n)*(vcenters?|hosts|vms|guests|benchmarks):", block):
                found.append((doc.name, block))
    return found


@pytest.mark.parametrize("doc, block", _runbooks_shown(), ids=lambda v: v if v.endswith(".md") else "")
def test_every_runbook_the_docs_show_is_one_the_schema_accepts(doc: str, block: str):
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in _validator().iter_errors(YAML(typ="safe").load(block))]
    assert not errors, errors


def _whole_runbooks_shown() -> list[tuple[str, str]]:
    """The runbooks shown that are not marked as a part of one (`# part of a runbook` on their first line)."""
    return [(doc, block) for doc, block in _runbooks_shown() if not block.startswith("# part of a runbook")]


@pytest.mark.parametrize("doc, block", _whole_runbooks_shown(), ids=lambda v: v if v.endswith(".md") else "")
def test_every_whole_runbook_the_docs_show_passes_validate(doc: str, block: str, tmp_path):
    from gpuvm.runbook.loader import load_runbook

    runbook = tmp_path / "shown.yaml"  # its placeholders filled in: a digest is the reader's to give
    runbook.write_text(block.replace("<64 hex digits>", "a" * 64), encoding="utf-8")
    load_runbook(runbook)  # an InputError names the block's line and field


COMMON_OPTIONS = {"--insecure", "--accept-new-host-keys", "--state-dir"}  # the guide's "Common options"


def _synopses() -> dict[str, str]:
    """The guide's Commands block: each command's synopsis (its line and the indented lines after it)."""
    guide = (REPO / "docs" / "guide.md").read_text(encoding="utf-8")
    block = re.search(r"## Commands\n\n```\n(.*?)```", guide, re.S).group(1)
    synopses: dict[str, str] = {}
    for line in block.splitlines():
        if line.startswith("gpuvm "):
            words = line.split("#")[0].split()[1:]
            command = " ".join(itertools.takewhile(lambda word: re.fullmatch(r"[a-z][a-z-]*", word), words))
            synopses[command] = line.split("#")[0]
        else:
            synopses[command] += line.split("#")[0]
    return synopses


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_the_guides_synopsis_of_a_command_lists_its_every_flag(path, command):
    synopsis = _synopses().get(" ".join(path))
    assert synopsis is not None, f"gpuvm {' '.join(path)}: no synopsis in docs/guide.md's Commands"
    if synopsis.rstrip().endswith(" ..."):
        return  # a synopsis that says there is more (size): its flags are in the benchmark guide
    flags = [opt for param in command.params for opt in param.opts
             if opt.startswith("--") and opt != "--help" and opt not in COMMON_OPTIONS]
    missing = [flag for flag in flags if not re.search(rf"{re.escape(flag)}(?![\w-])", synopsis)]
    assert not missing, f"gpuvm {' '.join(path)}: flags not in its synopsis in docs/guide.md's Commands: {missing}"


def test_gpuvm_help_lists_the_commands_in_the_guides_order():
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, ["--help"]).stdout.split("Commands:")[1]
    listed_commands = re.findall(r"^\s+([a-z-]+)\s", shown, re.M)
    in_guide = list(dict.fromkeys(command.split()[0] for command in _synopses()))
    assert listed_commands == in_guide
