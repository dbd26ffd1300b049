"""fast_yaml reads a runbook as ruamel's round-trip loader does (same data, same line of every key and
item), and hands everything it does not read itself back to ruamel (None)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from gpuvm.errors import InputError
from gpuvm.runbook import fast_yaml
from gpuvm.runbook.document import Locator
from gpuvm.runbook.loader import load_runbook

REPO = Path(__file__).parents[2]
RUNBOOKS = sorted([*REPO.glob("playbooks/*.yaml"), *REPO.glob("tests/fixtures/**/*.yaml"),
                   *REPO.glob("tests/steps/**/*.yaml")])


def ruamel_read(text: str):
    data = YAML(typ="rt").load(text)
    return data, Locator.of(Path("x"), data)._lines


def fleet(vms: int) -> str:
    lines = ["vcenter: {password_env: VC_PASS}  # a comment", "hosts:", "  - name: esx-01", "    passthrough:",
             "      - {model: A100}", "vms:"]
    for v in range(vms):
        lines += [f"  - name: vm{v}", "    host: esx-01", "    power: off", "    memory_gb: 0x40",
                  f"    gpus: {{mode: passthrough, count: {v % 3}}}", "    notes: |", "      a block", "      scalar",
                  "    tags: ['017', 017, 1_000, 1.5e3, yes, ~, 2024-01-02]", ""]
    return "\n".join(lines)


def test_the_project_runbooks_and_step_cases_read_as_ruamel_reads_them():
    handled = 0
    for file in RUNBOOKS:
        text = file.read_text(errors="replace")
        fast = fast_yaml.load(text)
        if fast is None:
            continue
        handled += 1
        assert fast == ruamel_read(text), file
    assert handled >= 0.9 * len(RUNBOOKS) > 100  # the plain shape is the common case


def test_yaml_1_2_scalars_and_lines_of_a_fleet():
    text = fleet(50)
    data, lines = fast_yaml.load(text)
    assert (data, lines) == ruamel_read(text)
    vm = data["vms"][7]
    assert vm["power"] == "off" and vm["memory_gb"] == 64 and vm["notes"] == "a block\nscalar\n"
    assert vm["tags"][:5] == ["017", 17, 1000, 1500.0, "yes"] and vm["tags"][5] is None
    assert lines[("vms", 7)] == lines[("vms", 7, "name")] == 7 + 7 * 10 and lines[("vms", 7, "gpus", "count")] == 81


@pytest.mark.parametrize("text", [
    "a: &x {b: 1}\nc: *x\n",  # anchors and aliases
    "base: &b {cpus: 4}\nvm: {<<: *b, name: x}\n",  # merge key
    "a: !custom 1\n",  # a tag
    "a: !!str 1\n",
    "a: 1\na: 2\n",  # a key given twice
    "%YAML 1.1\n---\npower: off\n",  # YAML 1.1 reads `off` as false
    "a: 1\n---\nb: 2\n",  # two documents
    "",  # no document
    "? [a, b]\n: 1\n",  # a complex key
    "1: a\n",  # a key that is not a string
    "a: 2024-02-30\n",  # a date that does not exist
    "a: [1, 2\n",  # a syntax error
    "a:\n\t- b\n",  # a tab
], ids=["alias", "merge", "tag", "str-tag", "duplicate", "yaml-1.1", "two-docs", "empty", "complex-key", "int-key",
        "bad-date", "syntax", "tab"])
def test_what_it_does_not_read_goes_to_ruamel(text):
    assert fast_yaml.load(text) is None


def test_load_runbook_names_lines_either_way(tmp_path):
    text = "vcenter: {password_env: VC_PASS}\nhosts:\n  - name: esx-01\nvms:\n" + "".join(
        f"  - name: vm{v}\n    host: esx-01\n    power: off\n    cpus: {-2 if v == 2 else 4}\n" for v in range(4))
    plain = tmp_path / "plain.yaml"
    plain.write_text(text)
    anchored = tmp_path / "anchored.yaml"  # read by ruamel
    anchored.write_text(text.replace("vms:\n", "topology: &t warn\nvms:\n"))
    assert fast_yaml.load(text) is not None and fast_yaml.load(anchored.read_text()) is None
    for file in (plain, anchored):
        with pytest.raises(InputError, match=rf"^{file}:(\d+): vms\[2\]\.cpus: ") as error:
            load_runbook(file)
        line = int(str(error.value).split(":")[1])
        assert file.read_text().splitlines()[line - 1] == "    cpus: -2"


def test_plain_scalars_of_every_first_character_read_as_ruamel_reads_them():
    """A plain scalar whose first character ruamel's resolver tries no type for is taken as a string
    without asking it (issue 34: most of a 16,384-VM runbook's names); every other, as ruamel says."""
    words = ["x", "1", "1.5", "0x1f", "017", "1_000", "-3", "+3", ".inf", "-.inf", ".nan", "~", "null", "Null", "true",
             "True", "FALSE", "yes", "no", "on", "off", "2024-01-02", "2024-01-02 10:00:00", "=", "<<x"]
    values = [c + w for c in "abcdeFNTfnty~.+-=0123456789_/$^(" for w in ["", *words]]
    text = "".join(f"k{i}: {value}\n" for i, value in enumerate(values)
                   if value not in ("-", "="))  # "-": an item; "=": a TaggedScalar, equal to none
    fast = fast_yaml.load(text)
    assert fast is not None and fast == ruamel_read(text)


def test_a_top_level_value_is_read_from_the_events_up_to_it_only():
    """What gpuvm/read_ahead.py reads before the runbook: the `vcenter:` or `vcenters:` entry, as `load` reads it."""
    text = "vcenter:\n  user: admin\n  call_timeout: 017\nhosts:\n" + "".join(f"  - {{name: esx-{i}}}\n" for i in range(100))
    assert fast_yaml.top_value(text, "vcenter") == ("vcenter", {"user": "admin", "call_timeout": 17})
    assert fast_yaml.top_value(text, "vcenters", "vcenter") == ("vcenter", {"user": "admin", "call_timeout": 17})
    assert fast_yaml.top_value(text, "hosts")[1][99] == {"name": "esx-99"}
    assert fast_yaml.top_value("vcenters:\n  - {name: west}\n  - {name: east}\n", "vcenter", "vcenters") == (
        "vcenters", [{"name": "west"}, {"name": "east"}])
    assert fast_yaml.top_value(text, "vms") is None  # not in the document
    assert fast_yaml.top_value(text, "hosts", within=100) is None  # not within the events read
    assert fast_yaml.top_value("hosts: []\nvcenter: {url: 'https://vc'}\n", "vcenter") == ("vcenter", {"url": "https://vc"})
    assert fast_yaml.top_value("vcenter: &v {user: a}\n", "vcenter") is None  # an anchor: ruamel's to read
    assert fast_yaml.top_value("- a\n- b\n", "vcenter") is None
