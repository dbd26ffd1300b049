"""Campaign setups (runbook overlays), the derived network, and results of several setups merged."""

from __future__ import annotations

import textwrap

import pytest

from gpuvm.apply_options import ApplyOptions
from gpuvm.bench.campaign import plan_campaign, plan_stages
from gpuvm.bench.dry_run import describe
from gpuvm.bench.compare import compare, point_label
from gpuvm.bench.network import NetworkMapping, derive, read_port_maps
from gpuvm.bench.results import Benchmark, Point, Repeat, Results, merge_results
from gpuvm.bench.stages import preflight, relaid
from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.parsers.ibdev2netdev import PortMap
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.runbook.loader import load_runbook
from gpuvm.runbook.setups import select_setup, setup_runbooks
from gpuvm.steps import reboot_memo
from gpuvm.vsphere.intent import Intent

BASE = """\
hosts: [{name: esx-01}]
vms:
  - {name: vm1, host: esx-01, cpus: 32, memory_gb: 64, gpus: {mode: passthrough, count: 2}, nics: [{address: "0000:4b:00.0"}]}
  - {name: vm2, host: esx-01, cpus: 32, memory_gb: 64, gpus: {mode: passthrough, count: 2}, nics: [{address: "0000:4b:00.1"}]}
guests:
  hosts:
    - {vm: vm1, ssh: {address: 10.0.0.1}, slots: 2, rdma_ports: [{device: mlx5_0, port: 1}]}
    - {vm: vm2, ssh: {address: 10.0.0.2}, slots: 2, rdma_ports: [{interface: ens64np2}]}
"""
SETUPS = """\
  setups:
    - name: one
      vms: [{name: vm1}]
    - name: two
      vms: [{name: vm1, gpus: {mode: passthrough, count: 1}}, {name: vm2, gpus: {mode: passthrough, count: 1}}]
      guests: [{vm: vm1, slots: 1}, {vm: vm2, slots: 1}]
"""
RUN = """\
  runs:
    - {name: c, kind: nccl_allreduce, scenario: concurrent}
"""


def book(tmp_path, benchmarks: str = SETUPS + RUN, base: str = BASE):
    path = tmp_path / "rb.yaml"
    path.write_text(base + "benchmarks:\n" + textwrap.dedent(benchmarks).replace("\n", "\n  ").rstrip() + "\n"
                    if not benchmarks.startswith("  ") else base + "benchmarks:\n" + benchmarks)
    return load_runbook(path)


def test_a_setup_overlays_its_vms_and_guests_and_parks_the_others(tmp_path):
    runbook = book(tmp_path)
    (one, first), (two, second) = setup_runbooks(runbook)
    assert (one.name, two.name) == ("one", "two")
    vm1, vm2 = first.vms
    assert (vm1.power, vm1.gpus.count, len(vm1.nics)) == ("on", 2, 1)
    assert (vm2.power, vm2.gpus, vm2.nics, vm2.cpus) == ("off", None, [], 32)  # parked: its devices freed
    assert [g.vm for g in first.guests.hosts] == ["vm1"]  # the parked VM's guest is left out
    assert [(v.name, v.gpus.count, len(v.nics)) for v in second.vms] == [("vm1", 1, 1), ("vm2", 1, 1)]
    assert [(g.vm, g.slots) for g in second.guests.hosts] == [("vm1", 1), ("vm2", 1)]
    assert second.file == runbook.file and second.benchmarks.setups == []
    assert select_setup(runbook, "two").vms == second.vms and select_setup(runbook, None) is runbook
    # every setup names its whole layout: going from two back to one changes the VMs two runs
    assert relaid(second, first) == ["vm1", "vm2"] and relaid(first, first) == []


def test_a_concurrent_run_without_groups_takes_every_guest_of_its_setup(tmp_path):
    stages = plan_stages(book(tmp_path))
    assert [(s.setup, s.only) for s in stages] == [("one", ()), ("two", ())]
    one = plan_campaign(stages[0].runbook, setup="one")
    two = plan_campaign(stages[1].runbook, setup="two")
    assert [(p.setup, p.guests, p.vms, p.gpus_per_node) for p in one + two] == [
        ("one", ("vm1",), 1, 2), ("two", ("vm1", "vm2"), 2, 2)]
    assert plan_stages(book(tmp_path), setups=["two"])[0].setup == "two"
    with pytest.raises(InputError, match="--setup two: --local runs have no setups"):
        plan_stages(book(tmp_path, SETUPS + RUN.replace("scenario: concurrent", "nodes: [1]")), local=True,
                    setups=["two"])


def test_a_guest_without_slots_runs_as_many_ranks_as_its_vm_has_gpus_in_each_setup(tmp_path):
    """Two VMs of 2 GPUs, guests without `slots`: "2 VMs × 2 GPUs", not × 1; a setup's own count wins."""
    base = BASE.replace(", slots: 2", "")
    setups = SETUPS.replace("\n      guests: [{vm: vm1, slots: 1}, {vm: vm2, slots: 1}]", "").replace(
        "    - name: one\n      vms: [{name: vm1}]", "    - name: one\n      vms: [{name: vm1}, {name: vm2}]")
    stages = plan_stages(book(tmp_path, setups + RUN, base))
    points = [p for stage in stages for p in plan_campaign(stage.runbook, setup=stage.setup)]
    assert [(p.setup, {job.hosts for job in p.jobs}) for p in points] == [
        ("one", {(("localhost", 2),)}), ("two", {(("localhost", 1),)})]
    recorded = [Point(nodes=p.nodes, gpus_per_node=p.gpus_per_node, vms=p.vms, setup=p.setup, repeats=[Repeat(value=1)])
                for p in points]
    bench = Benchmark(name="c", kind="nccl_allreduce", scenario="concurrent", points=recorded)
    assert [point_label(bench, point) for point in recorded] == ["2 VMs × 2 GPUs", "2 VMs × 1 GPU"]


@pytest.mark.parametrize("benchmarks, error", [
    (SETUPS.replace("name: vm1}]", "name: vm9}]") + RUN, r"rb\.yaml:12: benchmarks\.setups\[0\]\.vms\[0\]\.name: "
                                                       r"VM 'vm9' is not in vms \(declared: vm1, vm2\)"),
    (SETUPS.replace("{name: vm1}]", "{name: vm1, cpus: zero}]") + RUN,
     r"rb\.yaml:12: benchmarks\.setups\[0\]\.vms\[0\]\.cpus: Input should be a valid integer"),
    (SETUPS.replace("{vm: vm2, slots: 1}", "{vm: vm2, slots: 1, colour: red}") + RUN,
     r"benchmarks\.setups\[1\]\.guests\[1\]\.colour: unknown field"),
    (SETUPS.replace("vms: [{name: vm1}]", "vms: [{name: vm1}]\n      guests: [{vm: vm2}]") + RUN,
     r"setups\[0\]\.guests\[0\]\.vm: VM 'vm2' is not powered on in setup 'one'"),
    (SETUPS.replace("name: two", "name: one") + RUN, r"setups\[1\]\.name: setup 'one' is declared twice"),
    (SETUPS + RUN.replace("concurrent}", "concurrent, setups: [three]}"),
     r"runs\[0\]\.setups\[0\]: no setup 'three' \(setups: one, two\)"),
    (SETUPS + RUN.replace("concurrent}", "concurrent, setups: [two]}"),
     r"setups\[0\]\.name: no benchmark runs in setup 'one'"),
    (SETUPS + RUN.replace("concurrent}", "nodes: [2]}").replace("scenario: ", "scaling: weak, x: ")
     .replace(", x: nodes", ", nodes"),
     r"runs\[0\]\.nodes\[0\]: 2 nodes, but the runbook has 1 guest\(s\) \(in setup 'one'\)"),
    (RUN.replace("concurrent}", "concurrent, network_mapping: [on, on]}"), r"network_mapping: \['on', 'on'\] names one twice"),
])  # fmt: skip
def test_bad_setups_name_file_line_and_field(tmp_path, benchmarks, error):
    with pytest.raises(InputError, match=error):
        book(tmp_path, benchmarks)


def test_network_mapping_is_derived_from_the_port_map_unless_the_run_sets_it(tmp_path):
    runbook = book(tmp_path, RUN)
    vm1, vm2 = runbook.guests.hosts
    ports = {"vm1": [PortMap("mlx5_0", 1, "ens64np1", True), PortMap("mlx5_1", 1, "ens64np2", False)],
             "vm2": [PortMap("mlx5_0", 1, "ens64np1", True), PortMap("mlx5_1", 1, "ens64np2", True)]}
    mapping = derive([vm1, vm2], ports)
    assert mapping == NetworkMapping(("mlx5_0:1", "mlx5_1:1"), ("ens64np1", "ens64np2"))
    run = runbook.benchmarks.runs[0]
    assert mapping.settings(run) == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME": "=ens64np1,ens64np2",
                                     "btl_tcp_if_include": "ens64np1,ens64np2"}
    own = run.model_copy(update={"env": {"NCCL_IB_HCA": "mlx5_4"}, "mpirun_args": ["-mca", "btl_tcp_if_exclude", "lo"]})
    assert mapping.settings(own) == {"NCCL_SOCKET_IFNAME": "=ens64np1,ens64np2"}
    assert mapping.settings(run.model_copy(update={"launch": "horovodrun"})).keys() == {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"}
    with pytest.raises(InputError, match=r"guest vm1: rdma port mlx5_0 port 1 not found by ibdev2netdev "
                                         r"\(ports: mlx5_1 port 1 ==> ens64np2\)"):
        derive([vm1], {"vm1": ports["vm1"][1:]})
    assert derive([vm1.model_copy(update={"rdma_ports": []})], {}) is None


def test_points_with_the_mapping_on_and_off_render_it_and_say_so(tmp_path):
    runbook = book(tmp_path, RUN.replace("scenario: concurrent}", "nodes: [2], network_mapping: [on, off]}"))
    ports = {"vm1": [PortMap("mlx5_0", 1, "ens64np1", True)], "vm2": [PortMap("mlx5_1", 1, "ens64np2", True)]}
    on, off = plan_campaign(runbook, ports=ports)
    assert (on.label, off.label, on.mapping, off.mapping) == ("nodes-2-mapping-on", "nodes-2-mapping-off", "on", "off")
    assert dict(on.network) == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME": "=ens64np1,ens64np2",
                                "btl_tcp_if_include": "ens64np1,ens64np2"}
    assert off.network == ()
    # each guest's ranks get its own ports' values (issue 22, item 7): through a wrapper in its workdir
    assert dict((vm, dict(s)) for vm, s in on.guest_network) == {
        "vm1": {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=ens64np1", "btl_tcp_if_include": "ens64np1"},
        "vm2": {"NCCL_IB_HCA": "=mlx5_1:1", "NCCL_SOCKET_IFNAME": "=ens64np2", "btl_tcp_if_include": "ens64np2"}}
    command = on.jobs[0].command
    assert on.jobs[0].network_script == "./gpuvm-net-c-nodes-2-mapping-on.sh"
    assert command.endswith(" ./gpuvm-net-c-nodes-2-mapping-on.sh all_reduce_perf -b 8 -e 8G -f 2 -g 1"), command
    assert "NCCL_IB_HCA" not in command and "btl_tcp_if_include" not in command  # -x and -mca are global
    assert "gpuvm-net" not in off.jobs[0].command and "^lo,docker0" in off.jobs[0].command
    assert off.guest_network == ()
    shown = "\n".join(describe([on], "w"))
    assert "  network on vm1 (derived from ibdev2netdev): NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens64np1" in shown
    assert "  network on vm2 (derived from ibdev2netdev): NCCL_IB_HCA==mlx5_1:1 NCCL_SOCKET_IFNAME==ens64np2" in shown
    # without port maps (not read yet) nothing is derived; --local runs each point once
    assert plan_campaign(runbook)[0].network == ()
    assert [p.label for p in plan_campaign(runbook, local=True)] == ["nodes-2"]


def test_a_guest_without_rdma_ports_gets_no_network_settings(tmp_path):
    runbook = book(tmp_path, RUN.replace("scenario: concurrent}", "nodes: [2], network_mapping: [on]}")
                   , base=BASE.replace(", rdma_ports: [{interface: ens64np2}]", ""))
    ports = {"vm1": [PortMap("mlx5_0", 1, "ens64np1", True)]}
    [on] = plan_campaign(runbook, ports=ports)
    assert dict((vm, dict(s)) for vm, s in on.guest_network) == {
        "vm1": {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=ens64np1", "btl_tcp_if_include": "ens64np1"},
        "vm2": {}}
    from gpuvm.bench.network import rank_script

    assert rank_script({}) == '#!/bin/sh\n# gpuvm: this guest\'s network settings (bench/network.py)\nexec "$@"\n'
    assert "export OMPI_MCA_btl_tcp_if_include=ens64np1\n" in rank_script(dict(on.guest_network[0][1]))
    assert "network on vm2 (derived from ibdev2netdev): none (no rdma_ports)" in "\n".join(describe([on], "w"))


def test_port_maps_are_read_on_the_guests_with_ports_and_errors_name_the_guest(tmp_path):
    runbook = book(tmp_path, RUN)
    vm1, vm2 = runbook.guests.hosts
    fake = FakeExecutor("vm1", {"ibdev2netdev": CommandResult("ibdev2netdev", 0, "mlx5_0 port 1 ==> ens64np1 (Up)\n", "")})
    assert read_port_maps({"vm1": fake}, [vm1]) == {"vm1": [PortMap("mlx5_0", 1, "ens64np1", True)]}
    broken = FakeExecutor("vm2", {"ibdev2netdev": CommandResult("ibdev2netdev", 127, "", "ibdev2netdev: not found")})
    with pytest.raises(RemoteCommandError, match="guest vm2: cannot read the port map"):
        read_port_maps({"vm2": broken}, [vm2])


def test_preflight_refuses_before_anything_when_a_flag_is_missing(tmp_path):
    runbook = book(tmp_path)
    stages = plan_stages(runbook)
    shown = []
    change = Change("vm.hardware", "vm2", "pci device (new)", "device", None, "gpu", Disruption.VM_POWER_OFF)

    def plan(stage_book):
        return Plan([change] if stage_book is stages[1].runbook else []), None

    with pytest.raises(InputError) as refused:
        preflight(stages, plan, lambda stage, p: shown.append(stage.setup), ApplyOptions())
    assert shown == ["one", "two"]  # every setup's plan shown first
    assert str(refused.value).splitlines() == [
        "refusing to run the campaign; nothing was changed:",
        "  setup two: VM(s) vm2 must be powered off for 1 change(s): pass --allow-power-off",
        "  setup one → two: VM(s) vm1 change layout and must be powered off: pass --allow-power-off",
    ]
    preflight(stages, plan, lambda *_: None, ApplyOptions(allow_power_off=True))  # allowed


def _results(setup: str | None, per_vm: dict[str, float], environment: str = "vm") -> Results:
    point = Point(nodes=1, gpus_per_node=len(per_vm), vms=len(per_vm), setup=setup,
                  repeats=[Repeat(value=sum(per_vm.values()), per_vm=per_vm)])
    return Results(environment=environment, benchmarks=[
        Benchmark(name="rn50", kind="tf_cnn_benchmarks", unit="images/sec", scenario="concurrent", points=[point])])


def test_results_of_several_directories_merge_side_by_side():
    merged = merge_results([("a", _results(None, {"vm1": 5500.0})),
                            ("b", _results("2vm-1gpu", {"vm1": 2700.0, "vm2": 2690.0}))])
    points = compare(merged).benchmarks[0].points
    assert [(p.setup, p.label, p.total, p.per_vm) for p in points] == [
        ("a", "1 VM × 1 GPU", 5500.0, {"vm1": 5500.0}),
        ("2vm-1gpu", "2 VMs × 1 GPU", 5390.0, {"vm1": 2700.0, "vm2": 2690.0})]
    with pytest.raises(InputError, match="b and a both measured rn50 at the same point"):
        merge_results([("a", _results("s", {"vm1": 1.0})), ("b", _results("s", {"vm1": 2.0}))])
    with pytest.raises(InputError, match="mix environments"):
        merge_results([("a", _results(None, {"vm1": 1.0})), ("b", _results(None, {"x": 1.0}, "bare-metal"))])


def test_old_results_without_setups_still_load(tmp_path):
    from gpuvm.bench.results import load_results

    old = tmp_path / "results.json"
    old.write_text('{"format": "gpuvm-results/1", "environment": "vm", "benchmarks": [{"name": "b", "kind": "k", '
                   '"points": [{"nodes": 1, "repeats": [{"value": 1.0}]}]}]}')
    loaded = load_results(old)
    assert loaded.setups == [] and loaded.benchmarks[0].points[0].setup is None


def test_preflight_refuses_a_setup_that_would_reboot_a_host_again_like_apply(tmp_path):
    """A setup whose layout waits on a reboot that did not help (steps/reboot_memo.py) is refused up
    front as `apply` refuses it (exit 4, naming setup and host), unless --allow-repeat-reboot."""
    runbook = book(tmp_path)
    stages = plan_stages(runbook)
    repeat = reboot_memo.notes([reboot_memo.Repeat("esx-01", Intent(run="run-1", why="rebooted", since="2026-01-01T00:00:00Z"), [
        Change("guest.nic_ats", "vm1", "ConnectX", "ATS_ENABLED (current)", "False(0)", "True(1)")])])

    def plan(stage_book):
        return Plan(notes=list(repeat) if stage_book is stages[1].runbook else []), None

    with pytest.raises(reboot_memo.RepeatedReboot) as refused:
        preflight(stages, plan, lambda *_: None, ApplyOptions(allow_power_off=True))
    assert refused.value.exit_code == 4
    assert "setup two: host esx-01: ATS_ENABLED (current) of ConnectX on vm1" in str(refused.value)
    assert "--allow-repeat-reboot" in str(refused.value)
    preflight(stages, plan, lambda *_: None, ApplyOptions(allow_power_off=True, allow_repeat_reboot=True))


def test_a_setups_apply_takes_apply_s_flags_and_verdict(tmp_path, mocker):
    """`bench run` applies a setup as `apply` does: --allow-repeat-reboot passed on, and a target not
    observed stops the campaign (exit 3) as it fails `apply`, not only a failed one."""
    from gpuvm.bench import runs as bench_runs
    from gpuvm.errors import TargetFailures
    from gpuvm.runs import Access, Applied

    book(tmp_path)
    applied = Applied(Plan(unobserved={"vm2": "vm2: cannot connect to 10.0.0.2:22: Connection refused"}),
                      outcome=mocker.Mock(failed={}, observed=set()))
    mocker.patch.object(bench_runs, "plan_loaded", return_value=(Plan(), None))
    apply_loaded = mocker.patch.object(bench_runs, "apply_loaded", return_value=applied)
    options = ApplyOptions(allow_power_off=True, allow_repeat_reboot=True)
    view = mocker.Mock()
    prepared = bench_runs.prepare_campaign(tmp_path / "rb.yaml", bench_runs.CampaignChoice(),
                                           Access(state_dir=tmp_path / "state"), options, view)
    with pytest.raises(TargetFailures) as stopped:
        prepared.layout(prepared.stages[0])
    assert stopped.value.exit_code == 3 and "vm2 (not observed)" in str(stopped.value)
    assert apply_loaded.call_args.args[2].allow_repeat_reboot is True
