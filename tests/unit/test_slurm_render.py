"""slurm.conf, gres.conf and cgroup.conf as guest.slurm renders them, the GRES each node gets, and
`scontrol show node -o` parsed."""

from __future__ import annotations

from pathlib import Path

from gpuvm.desired.slurm import Partition, SlurmCluster
from gpuvm.parsers.scontrol import parse_nodes
from gpuvm.steps.guest_slurm.render import Gres, MigInstance, NodeHardware, awaits_mig, gres_type, node_gres, render

A100 = "NVIDIA A100 80GB PCIe"
CLUSTER = SlurmCluster("lab", "gpu-vm-01", ("gpu-vm-01", "gpu-vm-02"),
                       (Partition("gpu", ("gpu-vm-01", "gpu-vm-02"), True), Partition("one", ("gpu-vm-02",), False, "60")),
                       extra=("SchedulerType=sched/backfill",))


def _hw(name: str, address: str, gpus: int = 0, devices: int = 0) -> NodeHardware:
    return NodeHardware(name, address, 8, 64000, (A100,) * gpus, tuple(f"/dev/nvidia{i}" for i in range(devices)))


def test_gres_type_from_the_gpu_model():
    assert gres_type("NVIDIA A100 80GB PCIe") == "a100-80gb-pcie"
    assert gres_type("NVIDIA H100 PCIe") == "h100-pcie"
    assert gres_type("Tesla V100-SXM2-16GB") == "tesla-v100-sxm2-16gb"


def test_whole_gpus_get_files_only_where_the_devices_are():
    assert node_gres(_hw("a", "x", 2, 2), None, None) == (Gres("a100-80gb-pcie", 2, ("/dev/nvidia0", "/dev/nvidia1")),)
    assert node_gres(_hw("a", "x", 2, 1), None, None) == (Gres("a100-80gb-pcie", 2),)
    assert node_gres(_hw("a", "x"), None, None) == ()


def test_a_mig_layout_gives_its_profiles_and_a_vgpu_its_profile():
    assert node_gres(_hw("a", "x", 2, 2), "all-3g.40gb", None) == (Gres("3g.40gb", 4),)
    assert node_gres(_hw("a", "x", 2, 2), "all-disabled", None) == (
        Gres("a100-80gb-pcie", 2, ("/dev/nvidia0", "/dev/nvidia1")),)
    assert node_gres(_hw("a", "x", 1), None, "grid_a100d-3-40c") == (Gres("grid_a100d-3-40c", 1),)


def _mig(hw: NodeHardware, layout: dict[int, list[str]], files: bool = True) -> NodeHardware:
    """`hw` with the MIG devices `layout` gives (GPU → profiles), each with its device files (cap minors
    as the driver numbers them, GPU instance ids from 1)."""
    from dataclasses import replace

    mig = []
    for gpu, profiles in layout.items():
        for gi, profile in enumerate(profiles, 1):
            first = 3 + (gpu * 15 + gi) * 9
            caps = (f"/dev/nvidia-caps/nvidia-cap{first}", f"/dev/nvidia-caps/nvidia-cap{first + 1}")
            mig.append(MigInstance(gpu, profile, (f"/dev/nvidia{gpu}", *caps) if files else ()))
    return replace(hw, mig=tuple(mig))


def test_mig_instances_of_the_runbooks_layout_get_their_device_files():
    hw = _mig(_hw("a", "x", 2, 2), {0: ["3g.40gb", "3g.40gb"], 1: ["3g.40gb", "3g.40gb"]})
    gres = node_gres(hw, "all-3g.40gb", None)
    assert [(g.type, g.count, g.multiple) for g in gres] == [("3g.40gb", 1, True)] * 4
    assert gres[0].files == ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13")
    assert gres[3].files == ("/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap156", "/dev/nvidia-caps/nvidia-cap157")
    assert not awaits_mig(hw, "all-3g.40gb", None)


def test_mig_instances_not_yet_the_runbooks_are_counted_and_awaited():
    """The plan that changes the layout: the runbook's types, counted; gres.conf is rendered again after guest.mig."""
    whole = _hw("a", "x", 2, 2)
    other = _mig(whole, {0: ["1g.10gb"] * 7, 1: ["3g.40gb", "3g.40gb"]})
    for hw in (whole, other):
        assert node_gres(hw, "all-3g.40gb", None) == (Gres("3g.40gb", 4),) and awaits_mig(hw, "all-3g.40gb", None)
    assert not awaits_mig(whole, None, None) and not awaits_mig(whole, None, "grid_a100d-3-40c")
    # the layout there, a capability device missing: counted (slurmd reports the shortfall), not awaited
    missing = _mig(whole, {0: ["3g.40gb", "3g.40gb"], 1: ["3g.40gb", "3g.40gb"]}, files=False)
    assert node_gres(missing, "all-3g.40gb", None) == (Gres("3g.40gb", 4),) and not awaits_mig(missing, "all-3g.40gb", None)


def test_a_mig_node_in_slurm_conf_and_gres_conf():
    hw = _mig(_hw("g2", "10.0.0.12", 2, 2), {0: ["3g.40gb", "3g.40gb"]})
    mig = ({"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
           {"devices": [1], "mig-enabled": False})
    from gpuvm.runbook.guests import MigDevices

    nodes = {"gpu-vm-02": (hw, node_gres(hw, tuple(MigDevices.model_validate(m) for m in mig), None))}
    files = render(CLUSTER, hw, nodes)
    assert "Gres=gpu:a100-80gb-pcie:1,gpu:3g.40gb:2 " in files.slurm_conf
    assert files.gres_conf.splitlines()[1:] == [
        "NodeName=gpu-vm-02 Name=gpu Type=a100-80gb-pcie File=/dev/nvidia1",
        "NodeName=gpu-vm-02 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap12,/dev/nvidia-caps/nvidia-cap13",
        "NodeName=gpu-vm-02 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22"]


def test_mig_devices_with_their_capability_files_from_the_guests_listings():
    from gpuvm.parsers.nvidia_caps import parse_mig_minors
    from gpuvm.parsers.nvidia_smi import parse_compute_instances
    from gpuvm.steps.guest_slurm.observe import mig_instances

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "tools"
    instances = parse_compute_instances((fixtures / "nvidia_smi_mig_lci.txt").read_text())
    minors = parse_mig_minors((fixtures / "proc_nvidia_caps_mig_minors_2gpus.txt").read_text())
    present = {"/dev/nvidia0", "/dev/nvidia1", *(f"/dev/nvidia-caps/nvidia-cap{m}" for m in (12, 13, 21, 22, 147, 148))}
    assert mig_instances(instances, minors, present) == (
        MigInstance(0, "3g.40gb", ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13")),
        MigInstance(0, "3g.40gb", ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")),
        MigInstance(1, "1c.3g.40gb", ("/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap147", "/dev/nvidia-caps/nvidia-cap148")),
        MigInstance(1, "1c.3g.40gb"))  # its compute instance 1's device (nvidia-cap149) is missing
    assert mig_instances(instances, {}, present)[0].files == ()  # no minors read: no files


def test_slurm_conf_names_every_node_by_its_vm_with_its_host_name_hardware_and_gres():
    """NodeName is the VM name (what `launch: srun` gives --nodelist); slurmd finds its line by NodeHostname."""
    nodes = {"gpu-vm-01": (_hw("g1", "10.0.0.11", 2, 2), node_gres(_hw("g1", "10.0.0.11", 2, 2), None, None)),
             "gpu-vm-02": (_hw("g2", "10.0.0.12", 2), node_gres(_hw("g2", "10.0.0.12", 2), "all-3g.40gb", None))}
    files = render(CLUSTER, nodes["gpu-vm-01"][0], nodes)
    conf = files.slurm_conf.splitlines()
    assert "SlurmctldHost=g1(10.0.0.11)" in conf and "ClusterName=lab" in conf
    assert "NodeName=gpu-vm-01 NodeHostname=g1 NodeAddr=10.0.0.11 CPUs=8 RealMemory=64000 Gres=gpu:a100-80gb-pcie:2 State=UNKNOWN" in conf
    assert "NodeName=gpu-vm-02 NodeHostname=g2 NodeAddr=10.0.0.12 CPUs=8 RealMemory=64000 Gres=gpu:3g.40gb:4 State=UNKNOWN" in conf
    assert "PartitionName=gpu Nodes=gpu-vm-01,gpu-vm-02 Default=YES MaxTime=INFINITE State=UP" in conf
    assert "PartitionName=one Nodes=gpu-vm-02 Default=NO MaxTime=60 State=UP" in conf
    assert "SchedulerType=sched/backfill" in conf and "MpiDefault=pmi2" in conf
    assert "ProctrackType=proctrack/cgroup" in conf and "TaskPlugin=task/cgroup,task/affinity" in conf
    assert files.gres_conf.splitlines()[1:] == [
        "NodeName=gpu-vm-01 Name=gpu Type=a100-80gb-pcie File=/dev/nvidia0,/dev/nvidia1",
        "NodeName=gpu-vm-02 Name=gpu Type=3g.40gb Count=4"]
    assert "ConstrainDevices=yes" in files.cgroup_conf


def test_without_cgroup_no_cgroup_plugins():
    from dataclasses import replace

    hw = _hw("g1", "10.0.0.11")
    files = render(replace(CLUSTER, cgroup=None, compute=("gpu-vm-01",)), hw, {"gpu-vm-01": (hw, ())})
    assert "ProctrackType=proctrack/linuxproc" in files.slurm_conf and "TaskPlugin=task/none" in files.slurm_conf
    assert "Gres=" not in files.slurm_conf.split("GresTypes=gpu")[1]
    assert "Constrain" not in files.cgroup_conf


SCONTROL = """\
NodeName=g1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.00 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100-80gb-pcie:2(S:0) NodeAddr=10.250.0.13 NodeHostName=g1 Version=22.05.8 OS=Linux RealMemory=1000 State=IDLE ThreadsPerCore=1 Partitions=gpu
NodeName=g2 Arch=x86_64 Gres=gpu:3g.40gb:4 NodeAddr=10.250.0.14 State=IDLE+DRAIN ThreadsPerCore=1 Reason=gres/gpu count reported lower than configured (0 < 4) [slurm@2026-11-29T00:01:02]
NodeName=g3 Gres=(null) NodeAddr=10.250.0.15 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-11-29T00:01:02]
NodeName=g4 Gres=(null) NodeAddr=10.250.0.16 State=IDLE* Reason=(null)
"""


def test_scontrol_show_node_parsed_with_reasons_and_health():
    nodes = {n.name: n for n in parse_nodes(SCONTROL)}
    assert nodes["g1"].healthy and nodes["g1"].gres == "gpu:a100-80gb-pcie:2(S:0)" and nodes["g1"].address == "10.250.0.13"
    assert not nodes["g2"].healthy and nodes["g2"].reason == "gres/gpu count reported lower than configured (0 < 4)"
    assert not nodes["g3"].healthy and nodes["g3"].reason == "Not responding" and nodes["g3"].gres == ""
    assert not nodes["g4"].healthy and nodes["g4"].reason == ""


OBSERVED = """\
== packages ==
munge install ok installed
slurmd deinstall ok config-files
== hostname ==
gpu-vm-02
== cpus ==
2
== memory ==
MemTotal:        8056804 kB
== gpus ==
0, NVIDIA A100 80GB PCIe
1, NVIDIA A100 80GB PCIe
== devices ==
nvidia0
== mig ==
No MIG-enabled devices found.
== mig_minors ==
== caps ==
== key ==
06f961b802bc46ee168555f066d28f4f0e9afdf3f88174c1ee6f9de004fc30a0  /etc/munge/munge.key
400 munge
== configs ==
c0cde77fa8fef97d476c10aad3d2d54fcc2f336140d073651c2dcccf1e379fd6  /etc/default/slurmd
== services ==
active
inactive
inactive
"""


def test_a_guest_read_in_one_command_parsed():
    from gpuvm.steps.guest_slurm.observe import parse

    fact = parse(OBSERVED, "10.0.0.12", controller=False)
    assert fact.packages == {"munge"}  # a package removed with its config left is not installed
    assert fact.hardware == NodeHardware("gpu-vm-02", "10.0.0.12", 2, 7867, (A100, A100), ("/dev/nvidia0",))
    assert fact.key_sha256.startswith("06f961") and fact.key_mode == "400 munge"
    assert fact.configs == {"/etc/default/slurmd": "c0cde77fa8fef97d476c10aad3d2d54fcc2f336140d073651c2dcccf1e379fd6"}
    assert fact.active == {"munge"} and fact.nodes is None


def test_a_host_name_that_is_no_host_name_is_refused():
    import pytest

    from gpuvm.steps.guest_slurm.observe import parse
    from gpuvm.untrusted import UntrustedValueError

    with pytest.raises(UntrustedValueError, match="as a host name"):
        parse(OBSERVED.replace("gpu-vm-02", "x NodeName=evil"), "10.0.0.12", controller=False)


def test_the_munge_key_is_made_once_and_shown_only_as_a_digest(tmp_path):
    from gpuvm.steps.guest_slurm.munge_key import digest_shown, load_munge_key, munge_key

    assert load_munge_key(tmp_path) is None
    key = munge_key(tmp_path)
    assert munge_key(tmp_path) == key and len(key.data()) == 1024
    assert (key.path.stat().st_mode & 0o777) == 0o600
    assert digest_shown(key.sha256) == "sha256:" + key.sha256[:12] and key.data().hex()[:12] not in digest_shown(key.sha256)


def test_a_guests_mig_devices_read_in_the_same_command():
    from gpuvm.steps.guest_slurm.observe import parse

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "tools"
    lci = "\n".join(fixtures.joinpath("nvidia_smi_mig_lci.txt").read_text().splitlines()[:10])  # GPU 0's two instances
    text = OBSERVED.replace("== mig ==\nNo MIG-enabled devices found.\n== mig_minors ==\n== caps ==\n",
                            f"== mig ==\n{lci}\n== mig_minors ==\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"
                            "gpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n== caps ==\nnvidia-cap12\nnvidia-cap13\nnvidia-cap21\n")
    mig = parse(text, "10.0.0.12", controller=False).hardware.mig
    assert mig == (MigInstance(0, "3g.40gb", ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13")),
                   MigInstance(0, "3g.40gb"))  # nvidia-cap22 is not there


# -- Cores= from the GPUs' NUMA node ------------------------------------------------------------

def _lscpu(sockets: int, cores: int, threads: int) -> str:
    """`lscpu -p=CPU,CORE,SOCKET` as Linux numbers CPUs: every core's first thread, then the second ones."""
    per_thread = sockets * cores
    rows = [f"{t * per_thread + c},{c},{c // cores}" for t in range(threads) for c in range(per_thread)]
    return "# The following is the parsable format, which can be fed to other\n# CPU,Core,Socket\n" + "\n".join(rows)


def test_cpu_lists_and_slurms_core_indices():
    import pytest

    from gpuvm.errors import RemoteCommandError
    from gpuvm.parsers.cpus import cpulist, parse_cpulist, parse_lscpu

    assert parse_cpulist("0-2,5\n") == {0, 1, 2, 5} and cpulist({5, 0, 2, 1}) == "0-2,5"
    with pytest.raises(RemoteCommandError, match="CPU list"):
        parse_cpulist("3-1")
    host = parse_lscpu(_lscpu(2, 32, 2))  # the R750xa: CPUs 64-127 are the second threads of cores 0-63
    assert host.threads_per_core == 2 and host.core_of[0] == host.core_of[64] == 0 and host.core_of[95] == 31
    vm = parse_lscpu(_lscpu(2, 16, 1))
    assert vm.threads_per_core == 1 and vm.core_of == {cpu: cpu for cpu in range(32)}


def test_a_gpus_cores_only_when_the_guest_knows_its_numa_node():
    from gpuvm.parsers.cpus import parse_lscpu, parse_pci_cpus
    from gpuvm.steps.guest_slurm.observe import gpu_cores

    bus = {0: "0000:17:00.0", 1: "0000:ca:00.0"}
    host = parse_lscpu(_lscpu(2, 32, 2))
    pci = parse_pci_cpus("0000:17:00.0 0 0-31,64-95\n0000:ca:00.0 1 32-63,96-127\n0000:17:00.1 0 0-31,64-95\n")
    assert gpu_cores(bus, pci, host, 2) == ("0-31", "32-63")  # core indices, not CPU ids
    vm = parse_lscpu(_lscpu(1, 16, 1))
    no_vnuma = parse_pci_cpus("0000:17:00.0 -1 0-15\n0000:ca:00.0 -1 0-15\n")
    assert gpu_cores(bus, no_vnuma, vm, 2) == ()
    one_node = parse_pci_cpus("0000:17:00.0 0 0-15\n0000:ca:00.0 0 0-15\n")  # all its CPUs: no preference
    assert gpu_cores(bus, one_node, vm, 2) == ()


def test_cores_in_gres_conf_for_gpus_and_their_mig_instances():
    from dataclasses import replace

    hw = replace(_hw("g2", "10.0.0.12", 4, 4), cores=("0-15", "0-15", "16-31", "16-31"), threads_per_core=2)
    gres = node_gres(hw, None, None)
    assert gres == (Gres("a100-80gb-pcie", 2, ("/dev/nvidia0", "/dev/nvidia1"), cores="0-15"),
                    Gres("a100-80gb-pcie", 2, ("/dev/nvidia2", "/dev/nvidia3"), cores="16-31"))
    mig = _mig(hw, {2: ["3g.40gb", "3g.40gb"]})
    from gpuvm.runbook.guests import MigDevices

    layout = (MigDevices.model_validate({"devices": [2], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}),)
    files = render(CLUSTER, mig, {"gpu-vm-02": (mig, node_gres(mig, layout, None))})
    assert files.gres_conf.splitlines()[1:] == [
        "NodeName=gpu-vm-02 Name=gpu Type=a100-80gb-pcie File=/dev/nvidia0,/dev/nvidia1 Cores=0-15",
        "NodeName=gpu-vm-02 Name=gpu Type=a100-80gb-pcie File=/dev/nvidia3 Cores=16-31",
        "NodeName=gpu-vm-02 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap282,"
        "/dev/nvidia-caps/nvidia-cap283 Cores=16-31",
        "NodeName=gpu-vm-02 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap291,"
        "/dev/nvidia-caps/nvidia-cap292 Cores=16-31"]
    assert "CPUs=8 ThreadsPerCore=2 RealMemory=64000 Gres=gpu:a100-80gb-pcie:3,gpu:3g.40gb:2 " in files.slurm_conf
    unknown = _hw("g", "x", 2, 2)
    assert "Cores=" not in render(CLUSTER, unknown, {"n": (unknown, node_gres(unknown, None, None))}).gres_conf


def test_a_gpus_numa_node_read_in_the_same_command():
    from gpuvm.steps.guest_slurm.observe import parse

    text = OBSERVED.replace("== key ==\n", "== bus_ids ==\n0, 00000000:17:00.0\n1, 00000000:CA:00.0\n== pci_cpus ==\n"
                            "0000:17:00.0 0 0-0\n0000:ca:00.0 1 1\n== lscpu ==\n# CPU,Core,Socket\n0,0,0\n1,1,1\n== key ==\n")
    assert parse(text, "10.0.0.12", controller=False).hardware.cores == ("0", "1")
    assert parse(OBSERVED, "10.0.0.12", controller=False).hardware.cores == ()
