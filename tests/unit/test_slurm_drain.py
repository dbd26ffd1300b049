"""Host reboots that drain, not kill (issue 36): the Slurm nodes of a host's VMs are drained before
the reboot, their jobs waited for (bounded by --drain-timeout, refused up front without it), the
nodes resumed after; the drain is an intent recorded on the host; a drain someone else set is
never lifted."""

from __future__ import annotations

import re
import shlex

import pytest

from gpuvm.apply_options import ApplyOptions
from gpuvm.desired.slurm_nodes import SlurmNodes
from gpuvm.desired.ssh import DesiredGuest, Login
from gpuvm.engine import check_allowed
from gpuvm.desired import Desired
from gpuvm.errors import InputError, TaskError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.parsers import squeue
from gpuvm.parsers.scontrol import SlurmNodeState, parse_nodes
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.remote import Cluster
from gpuvm.steps import host_reboot, slurm_drain
from gpuvm.steps.base import Context, Options
from gpuvm.steps.host_reboot import RebootFact, RebootHost, StopForReboot
from gpuvm.steps.slurm_drain import DrainFact, DrainNodes, ResumeNodes
from gpuvm.vsphere.intent import Intent
from tests.unit.factories import inventory, r750xa, vm
from tests.unit.test_reboot_intent import World, world  # noqa: F401 (the fixture)

RUN = "0123456789ab"
OURS = f"gpuvm: reboot of esx-01 (run {RUN})"
# `scontrol show node -o` of Debian's Slurm 22.05 (trimmed in the middle), a node drained while its job runs
SHOW_NODE = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=5.17 "
             "Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC "
             "@0  RealMemory=1 State=ALLOCATED+DRAIN ThreadsPerCore=1 TmpDisk=0 Partitions=debug  "
             "BootTime=2026-11-28T20:25:48 CfgTRES=cpu=1,mem=1M,billing=1 AllocTRES=cpu=1,mem=1M CapWatts=n/a "
             "ExtSensorsTemp=n/s Reason=gpuvm: reboot of esx-01 (run abcdef012345) [root@2026-11-29T00:15:00]\n"
             "NodeName=n2 Arch=x86_64 CoresPerSocket=1 State=IDLE ThreadsPerCore=1 Partitions=debug\n")


class Slurm:
    """A controller guest's Slurm: nodes (state, reason) and jobs (id → nodes, polls left before it ends);
    each scontrol update lands in the world's log."""

    def __init__(self, world: World, nodes: dict[str, tuple[str, str]], jobs: dict[str, tuple[set[str], int]]):
        self.world, self.nodes, self.jobs = world, dict(nodes), dict(jobs)
        self.executor = FakeExecutor("ctl", {"scontrol show node -o": lambda call: self._show(call.command),
                                             re.compile(r"^squeue "): lambda call: self._queue(call.command),
                                             re.compile(r"^scontrol update "): lambda call: self._update(call.command)})

    def _show(self, command: str) -> CommandResult:
        lines = [f"NodeName={n} Arch=x86_64 State={s} Partitions=debug" + (f" Reason={r} [root@2026-11-29T00:15:00]"
                                                                         if r else "")
                 for n, (s, r) in self.nodes.items()]
        return CommandResult(command, 0, "\n".join(lines) + "\n", "")

    def _queue(self, command: str) -> CommandResult:
        wanted = set(shlex.split(command)[shlex.split(command).index("-w") + 1].split(","))
        listed = []
        for job, (on, polls) in list(self.jobs.items()):
            if polls <= 0:
                del self.jobs[job]
                continue
            self.jobs[job] = (on, polls - 1)
            if on & wanted:
                listed.append(f"{job}|alice|RUNNING|train")
        return CommandResult(command, 0, "\n".join(listed), "")

    def _update(self, command: str) -> CommandResult:
        args = dict(a.split("=", 1) for a in shlex.split(command)[2:])
        names = args["nodename"].split(",")
        for name in names:
            state = self.nodes[name][0].split("+")[0]
            self.nodes[name] = (state + "+DRAIN", args["reason"]) if args["state"] == "DRAIN" else (state, "")
        self.world.log.append((f"slurm {args['state'].lower()}", ",".join(names)) + ((args["reason"],) if "reason" in args else ()))
        return CommandResult(command, 0, "", "")


def cluster(tmp_path, executor: FakeExecutor) -> Cluster:
    return Cluster(tmp_path, targets={"ctl": DesiredGuest("ctl", Login("ctl", user="gpuadmin"))}, executors={"ctl": executor})


def reboot(world: World, mocker, tmp_path, fake: Slurm, drain: DrainNodes | None = None,
           resume: ResumeNodes | None = None, rebooting: bool = True, **options) -> dict[str, Exception]:
    ctx = Context(session=mocker.MagicMock(), options=Options(shutdown_timeout=1, task_timeout=5, **options),
                  inventory=inventory([r750xa()], [vm("gpu-vm", power_state="poweredOn")]),
                  cluster=cluster(tmp_path, fake.executor), slurm=SlurmNodes("ctl", ("gpu-vm",)))
    ctx.session.ref.side_effect = world.ref
    ctx.intents = mocker.MagicMock(record=world.record, clear=world.clear, current=world.current, run=RUN)
    host = [Change("host.reboot", "esx-01", "host", "reboot", "1", "rebooted", Disruption.HOST_REBOOT, RebootHost())]
    changes = {"esx-01": (host if rebooting else [])
               + [Change("host.reboot", "esx-01", "slurm nodes", "state", "", "", Disruption.NONE, a)
                  for a in (drain, resume) if a is not None]}
    if rebooting:
        changes["gpu-vm"] = [Change("host.reboot", "gpu-vm", "vm", "power", "on", "off", Disruption.VM_POWER_OFF,
                                    StopForReboot("esx-01", restore=True))]
    return host_reboot.apply_all(ctx, changes, 1)


@pytest.fixture
def no_wait(mocker):
    """The drain's wait between two looks at the jobs, without waiting; time moves 5 s a look."""
    clock = iter(range(0, 100000, 5))
    mocker.patch.object(slurm_drain.time, "monotonic", side_effect=lambda: next(clock))
    return mocker.patch.object(slurm_drain.UNDER_WAY.interrupted, "wait", return_value=False)


def test_scontrol_and_squeue_output_is_read_with_the_reason_whole_and_who_set_it_cut_off():
    nodes = {n.name: n for n in parse_nodes(SHOW_NODE)}
    assert nodes["n1"].reason == "gpuvm: reboot of esx-01 (run abcdef012345)" and nodes["n2"].reason == ""
    assert slurm_drain.taken(nodes["n1"]) and not slurm_drain.taken(nodes["n2"])
    assert slurm_drain.taken(SlurmNodeState("n", "DOWN+NOT_RESPONDING", "")) and not slurm_drain.taken(
        SlurmNodeState("n", "MIXED", ""))
    assert squeue.jobs("12|alice|RUNNING|train|v2\n13_4|bob|COMPLETING|x\n") == [
        squeue.Job("12", "alice", "RUNNING", "train|v2"), squeue.Job("13_4", "bob", "COMPLETING", "x")]
    with pytest.raises(Exception, match="could not parse the output of `squeue"):
        squeue.jobs("squeue: error: Invalid node name nosuch\n")


def test_a_reboot_with_jobs_on_its_nodes_is_refused_up_front_naming_them_unless_a_drain_timeout_is_given():
    fact = DrainFact({"n1": SlurmNodeState("n1", "ALLOCATED", ""),
                      "n2": SlurmNodeState("n2", "IDLE+DRAIN", "", "bad gpu")},
                     [squeue.Job("12", "alice", "RUNNING", "train")], controller="ctl", names=("n1", "n2", "n4"))
    changes = slurm_drain.plan("esx-01", fact, True, None)
    assert [(c.target, c.before, c.after) for c in changes] == [
        ("esx-01", "n1 allocated, n2 idle+drain; job(s) 12 (alice: train) running",
         "drained for the reboot, resumed after it (n2: left as found)")]
    assert changes[0].action == DrainNodes("ctl", ("n1", "n2", "n4"), ("12 (alice: train)",))  # n4: unknown to Slurm now
    plan = Plan(changes=changes)
    with pytest.raises(InputError, match=r"host esx-01 must reboot while Slurm job\(s\) 12 \(alice: train\) run on "
                                         r"its nodes n1, n2, n4: pass --drain-timeout SECONDS"):
        check_allowed(plan, Desired(hosts={}, vms={}), ApplyOptions(allow_host_reboot=True))
    check_allowed(plan, Desired(hosts={}, vms={}), ApplyOptions(allow_host_reboot=True, drain_timeout=600))
    idle = slurm_drain.plan("esx-01", DrainFact({"n1": SlurmNodeState("n1", "IDLE", "")}, controller="ctl"), True, None)
    check_allowed(Plan(changes=idle), Desired(hosts={}, vms={}), ApplyOptions(allow_host_reboot=True))


def test_an_interrupted_drain_is_planned_resumed_unless_this_reboot_drains_those_nodes_again():
    recorded = Intent(run="abcdef012345", data={"controller": "ctl", "nodes": ["n1"]})
    alone = slurm_drain.plan("esx-01", None, False, recorded)
    assert [(c.before, c.action) for c in alone] == [("n1 drained by interrupted run abcdef012345",
                                                      ResumeNodes("ctl", ("n1",)))]
    again = slurm_drain.plan("esx-01", DrainFact({"n1": SlurmNodeState("n1", "IDLE+DRAIN", "", OURS)}, controller="ctl"),
                             True, recorded)
    assert [type(c.action) for c in again] == [DrainNodes]


def test_the_host_reboot_observes_its_vms_nodes_on_the_controller(tmp_path, mocker):
    """Each compute guest is the node named after its VM (as guest.slurm names it)."""
    from gpuvm.desired import DesiredHost

    fake = Slurm(World(), {"n1": ("ALLOCATED", ""), "n9": ("IDLE", ""), "box": ("IDLE", "")}, {"12": ({"n1"}, 5)})
    ctx = Context(inventory=inventory([r750xa()], [vm("n1", power_state="poweredOn"), vm("box"), vm("web")]),
                  cluster=cluster(tmp_path, fake.executor), slurm=SlurmNodes("ctl", ("n1", "box", "n9")),
                  planned=[Change("host.passthrough", "esx-01", "pci", "x", "off", "on", Disruption.HOST_REBOOT)])
    host = DesiredHost("esx-01", [], None, True, vms=["n1", "box"])
    fact = host_reboot.observe(ctx, host)
    assert fact.slurm == DrainFact({"n1": SlurmNodeState("n1", "ALLOCATED", ""),
                                    "box": SlurmNodeState("box", "IDLE", "")},
                                   [squeue.Job("12", "alice", "RUNNING", "train")], controller="ctl", names=("box", "n1"))
    assert "squeue -h -w box,n1 -o '%i|%u|%T|%j'" in fake.executor.commands  # not web (no node), not n9 (elsewhere)
    [drain] = [c for c in host_reboot.plan(host, fact) if isinstance(c.action, DrainNodes)]
    assert drain.action == DrainNodes("ctl", ("box", "n1"), ("12 (alice: train)",))
    ctx.planned.clear()
    assert host_reboot.observe(ctx, host).slurm is None  # no reboot planned: Slurm not asked
    assert fake.executor.commands.count("scontrol show node -o") == 1


def test_nodes_are_drained_recorded_first_jobs_waited_for_then_resumed_after_the_host_is_back(
        world, mocker, tmp_path, no_wait):
    fake = Slurm(world, {"n1": ("ALLOCATED", ""), "n3": ("IDLE+DRAIN", "bad gpu")}, {"12": ({"n1"}, 2)})
    assert reboot(world, mocker, tmp_path, fake, DrainNodes("ctl", ("n1", "n3"), ("12 (alice: train)",)),
                  drain_timeout=600) == {}
    assert world.log[:3] == [("record drain", "host-esx-01"), ("slurm drain", "n1", OURS),
                             ("record power-off", "vm-gpu-vm")]  # n3 was drained by someone else: not ours
    assert no_wait.call_count == 2  # two looks found job 12 still running
    assert world.log[-5:] == [("power-on", "vm-gpu-vm"), ("clear power-off", "vm-gpu-vm"),
                              ("slurm resume", "n1"), ("clear drain", "host-esx-01"), ("record rebooted", "host-esx-01")]
    assert fake.nodes == {"n1": ("ALLOCATED", ""), "n3": ("IDLE+DRAIN", "bad gpu")}  # someone else's drain stays
    assert {(c.command.split()[1], c.sudo) for c in fake.executor.calls} == {  # updates as root: Slurm's operators'
        ("show", False), ("-h", False), ("update", True)}
    assert ("host-esx-01", "drain") not in world.intents


def test_a_job_still_running_past_the_drain_timeout_fails_the_host_untouched_and_resumes_its_nodes(
        world, mocker, tmp_path, no_wait):
    fake = Slurm(world, {"n1": ("ALLOCATED", "")}, {"12": ({"n1"}, 1000)})
    failed = reboot(world, mocker, tmp_path, fake, DrainNodes("ctl", ("n1",)), drain_timeout=30)
    assert isinstance(failed["esx-01"], TaskError)
    assert str(failed["esx-01"]) == ("Slurm job(s) 12 (alice: train) still running on n1 after 30 s of drain: "
                                     "host esx-01 not rebooted, its nodes resumed")
    assert world.log == [("record drain", "host-esx-01"), ("slurm drain", "n1", OURS), ("slurm resume", "n1"),
                         ("clear drain", "host-esx-01")]  # no VM stopped, no reboot
    assert fake.nodes["n1"] == ("ALLOCATED", "")


def test_without_a_drain_timeout_a_job_started_since_the_plan_fails_the_host_at_once(world, mocker, tmp_path, no_wait):
    fake = Slurm(world, {"n1": ("ALLOCATED", "")}, {"12": ({"n1"}, 1000)})
    failed = reboot(world, mocker, tmp_path, fake, DrainNodes("ctl", ("n1",)))
    assert "started since the plan; --drain-timeout waits" in str(failed["esx-01"])
    assert no_wait.call_count == 0 and ("reboot", "host-esx-01") not in world.log


def test_a_node_drained_again_by_someone_else_during_the_reboot_keeps_their_drain(world, mocker, tmp_path, no_wait):
    fake = Slurm(world, {"n1": ("IDLE", "")}, {})
    world.host.RebootHost_Task = lambda force: (fake.nodes.update(n1=("IDLE+DRAIN", "disk check")),
                                                world._act("reboot", booted=2))[1]
    assert reboot(world, mocker, tmp_path, fake, DrainNodes("ctl", ("n1",)), drain_timeout=60) == {}
    assert not any(entry[0] == "slurm resume" for entry in world.log)
    assert fake.nodes["n1"] == ("IDLE+DRAIN", "disk check") and ("host-esx-01", "drain") not in world.intents


def test_the_next_run_resumes_what_a_killed_run_drained_and_clears_its_record(world, mocker, tmp_path, no_wait):
    fake = Slurm(world, {"n1": ("IDLE", f"{OURS.replace(RUN, 'abcdef012345')}"), "n2": ("IDLE", "")}, {})
    fake.nodes["n1"] = ("IDLE+DRAIN", fake.nodes["n1"][1])
    world.intents[("host-esx-01", "drain")] = {"controller": "ctl", "nodes": ["n1"]}
    assert reboot(world, mocker, tmp_path, fake, resume=ResumeNodes("ctl", ("n1",)), rebooting=False) == {}
    assert world.log == [("slurm resume", "n1"), ("clear drain", "host-esx-01")]
    assert fake.nodes["n1"] == ("IDLE", "") and ("host-esx-01", "drain") not in world.intents


def test_a_failed_reboot_resumes_the_nodes_it_drained(world, mocker, tmp_path, no_wait):
    world.fail = "reboot"
    fake = Slurm(world, {"n1": ("IDLE", "")}, {})
    failed = reboot(world, mocker, tmp_path, fake, DrainNodes("ctl", ("n1",)), drain_timeout=60)
    assert "reboot refused" in str(failed["esx-01"])
    assert world.log[-2:] == [("slurm resume", "n1"), ("clear drain", "host-esx-01")]
    assert ("power-on", "vm-gpu-vm") in world.log and fake.nodes["n1"] == ("IDLE", "")


def test_the_runbooks_controller_and_compute_guests_are_what_the_drain_asks(tmp_path):
    from gpuvm.resolve_slurm import slurm_nodes
    from gpuvm.runbook.loader import load_runbook
    from tests.unit.factories import ONE_GUEST_RUNBOOK

    file = tmp_path / "runbook.yaml"
    file.write_text(ONE_GUEST_RUNBOOK.format())
    assert slurm_nodes(load_runbook(file)) is None
    file.write_text(ONE_GUEST_RUNBOOK.format() + "slurm: {controller: gpu-vm-01}\n")
    assert slurm_nodes(load_runbook(file)) == SlurmNodes("gpu-vm-01", ("gpu-vm-01",))
