"""esxi.topology against the SSH test bed: NVLink pairs read with `nvidia-smi topo -m` in the ESXi shell."""

from __future__ import annotations

import pytest

from gpuvm.engine import observe_reachable
from gpuvm.errors import InputError
from gpuvm.steps import esxi_topology
from gpuvm.steps.base import Context
from tests.integration.test_guest_config import make_cluster, plan_of

pytestmark = pytest.mark.integration
R750XA_PAIRS = (("0000:17:00.0", "0000:31:00.0"), ("0000:b1:00.0", "0000:ca:00.0"))


def test_nvlink_pairs_are_read_before_planning(testbed, tmp_path):
    cluster = make_cluster(testbed, tmp_path)
    try:
        facts, _ = observe_reachable(cluster)
        fact = facts[("esxi.topology", "esx-01")]
        assert fact.pairs == R750XA_PAIRS and len(fact.gpus) == 4
        assert esxi_topology.discovered(facts)["esx-01"].pairs == R750XA_PAIRS  # what resolve() is given
        assert esxi_topology.plan(cluster.targets["esx-01"], fact) == []
    finally:
        cluster.close()


def test_a_declaration_the_shell_contradicts_is_refused(testbed, tmp_path):
    crossed = 'nvlink: [["0000:17:00.0", "0000:b1:00.0"], ["0000:31:00.0", "0000:ca:00.0"]]'
    cluster = make_cluster(testbed, tmp_path, host=crossed)
    try:
        with pytest.raises(InputError, match=r"runbook\.yaml:\d+: hosts\[0\]\.nvlink: esxi\.topology: host esx-01: "
                                             r"the declared NVLink pairs \(17:00\.0\+b1:00\.0, 31:00\.0\+ca:00\.0\) "
                                             r"are not what `nvidia-smi topo -m` shows \(17:00\.0\+31:00\.0, "
                                             r"b1:00\.0\+ca:00\.0\)"):
            plan_of(esxi_topology, cluster, "esx-01")
    finally:
        cluster.close()


def test_without_the_nvidia_host_driver_nothing_is_known(testbed, tmp_path):
    role = testbed.state("esx-01")["role"]
    testbed.set_state("esx-01", "role", "bare")  # the stand-in tools answer "not found"
    cluster = make_cluster(testbed, tmp_path)
    try:
        fact = esxi_topology.observe(Context(cluster=cluster), cluster.targets["esx-01"])
        assert fact.gpus == () and fact.unread.startswith("`nvidia-smi topo -m` exited 127")
        assert esxi_topology.discovered({("esxi.topology", "esx-01"): fact}) == {}
    finally:
        cluster.close()
        testbed.set_state("esx-01", "role", role)
