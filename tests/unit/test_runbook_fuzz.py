"""Property-based fuzzing of the runbook loader: thousands of generated documents.

Whatever the document, loading either gives a Runbook or raises InputError whose every line names
the file and a line number — never another exception, never a traceback.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from gpuvm.errors import InputError
from gpuvm.runbook.loader import load_runbook

VALID = (Path(__file__).parents[2] / "playbooks" / "lab.yaml").read_text()
KEYS = ["vcenter", "url", "user", "password_env", "insecure", "ca_file", "hosts", "vms", "guests", "name",
        "host", "passthrough", "model", "id", "address", "graphics", "allow_reboot", "allow_maintenance",
        "cpus", "memory_gb", "firmware", "gpus", "mode", "count", "addresses", "profile", "nics", "p2p",
        "mmio", "numa_node", "power", "ssh", "ats", "mig", "port", "key_file", "vm", "rdma_ports", "device",
        "interface", "ip", "mtu", "image", "ssh_mesh", "slots", "benchmarks", "bogus"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False),
                    st.sampled_from(["passthrough", "dynamic", "vgpu", "efi", "bios", "on", "off", "auto",
                                     "esx-01", "esx-01-vm1", "0000:17:00.0", "10de:20b5", "A100", "all",
                                     "shared_direct", "grid_a100d-3-40c", "$(reboot)", "a; rm -rf /", ""]),
                    st.text(max_size=12))
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=25,
)
LOCATED = re.compile(r"^\S+\.yaml:\d+: ")


def check(path: Path) -> None:
    try:
        load_runbook(path)
    except InputError as error:
        for line in str(error).splitlines():
            assert LOCATED.match(line), line
            assert "Traceback" not in line


def dump(document) -> str:
    out = io.StringIO()
    YAML().dump(document, out)
    return out.getvalue()


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), DOCUMENTS, max_size=6))
def test_generated_documents(tmp_path_factory, document):
    path = tmp_path_factory.mktemp("fuzz") / "runbook.yaml"
    path.write_text(dump(document))
    check(path)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(VALID) - 1), st.integers(1, 40), st.text(max_size=8))
def test_mutated_lab_runbook(tmp_path_factory, start, length, replacement):
    path = tmp_path_factory.mktemp("fuzz") / "runbook.yaml"
    path.write_text(VALID[:start] + replacement + VALID[start + length:])
    check(path)
