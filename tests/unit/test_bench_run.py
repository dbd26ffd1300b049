"""`gpuvm bench run`: the runbook section, the rendered launch lines, and the campaign over fakes."""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.bench.compare import compare
from gpuvm.bench.results import Benchmark, Point, Repeat, Results, load_results
from gpuvm.bench.campaign import LOCAL, plan_campaign, uploads
from gpuvm.bench.commands import launch_script, render_hostfile, stop_script
from gpuvm.bench.dry_run import describe
from gpuvm.bench.runner import CampaignRunner
from gpuvm.errors import InputError, RemoteCommandError, TargetFailures
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.runbook.loader import load_runbook
from gpuvm.secrets import remember

INFRA = """\
hosts: [{name: esx-01}, {name: esx-02}]
vms:
  - {name: vm1, host: esx-01, cpus: 32, memory_gb: 64, gpus: {mode: passthrough, count: 2}}
  - {name: vm2, host: esx-01, cpus: 32, memory_gb: 64, gpus: {mode: passthrough, count: 2}}
  - {name: vm3, host: esx-02, cpus: 32, memory_gb: 64, gpus: {mode: passthrough, count: 1}}
  - {name: vm4, host: esx-02}
guests:
  image: {name: gpuvm/dl, sshd_port: 12345}
  ssh_mesh: {container_port: 12345}
  hosts:
    - {vm: vm1, ssh: {address: 10.0.0.1, user: gpuadmin}, slots: 1}
    - {vm: vm2, ssh: {address: 10.0.0.2, user: gpuadmin}, slots: 1}
    - {vm: vm3, ssh: {address: 10.0.0.3, user: gpuadmin}, slots: 1}
    - {vm: vm4, ssh: {address: 10.0.0.4, user: root}, slots: 1}
"""

MPIRUN_COMMON = ("--tag-output -bind-to none -map-by slot -x LD_LIBRARY_PATH -x PATH -x NCCL_DEBUG=INFO "
                 "-x 'NCCL_SOCKET_IFNAME=^lo,docker0'")


def book(tmp_path: Path, benchmarks: str, infra: str = INFRA):
    path = tmp_path / "lab.yaml"
    path.write_text(infra + "benchmarks:\n" + textwrap.indent(textwrap.dedent(benchmarks), "  "))
    return load_runbook(path)


def one_run(**fields) -> str:
    lines = "\n".join(f"      {k}: {json.dumps(v)}" for k, v in fields.items())
    return "runs:\n    - name: b\n" + lines + "\n"


def commands(points) -> list[str]:
    return [job.command for point in points for job in point.jobs]


# ------------------------------------------------------------------------------------ rendering


def test_full_mpirun_line_for_tf_cnn_benchmarks(tmp_path):
    runbook = book(tmp_path, one_run(kind="tf_cnn_benchmarks", batch_size=1024, precision="fp16",
                                     nodes=[2], env={"NCCL_IB_HCA": "mlx5_0", "NCCL_IB_DISABLE": 0},
                                     mpirun_args=["-mca", "btl_tcp_if_include", "10.0.0.0/24"]))
    [point] = plan_campaign(runbook)
    assert point.jobs[0].command == (
        "mpirun -np 2 --hostfile hostfile-b-nodes-2 " + MPIRUN_COMMON + " -x NCCL_IB_HCA=mlx5_0 "
        "-x NCCL_IB_DISABLE=0 -mca pml ob1 -mca btl '^openib' -mca btl_tcp_if_include 10.0.0.0/24 "
        "python3 benchmarks/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py --model=resnet50 --batch_size=1024 "
        "--use_fp16 --variable_update=horovod --horovod_device=gpu"
    )
    assert point.jobs[0].launcher == "vm1"
    assert point.jobs[0].hosts == (("10.0.0.1", 1), ("10.0.0.2", 1))


@pytest.mark.parametrize("fields, program", [
    (dict(kind="horovod_synthetic"),
     "python3 tensorflow2_synthetic_benchmark.py --model ResNet50 --batch-size 64"),
    (dict(kind="horovod_synthetic", framework="pytorch", precision="fp16", steps=20, batch_size=32),
     "python3 pytorch_synthetic_benchmark.py --model resnet50 --batch-size 32 --fp16-allreduce --num-iters 20"),
    (dict(kind="nccl_allreduce"), "all_reduce_perf -b 8 -e 8G -f 2 -g 1"),
    (dict(kind="nccl_allreduce", program="/opt/nccl-tests/build/all_reduce_perf", args=["-n", "50"]),
     "/opt/nccl-tests/build/all_reduce_perf -b 8 -e 8G -f 2 -g 1 -n 50"),
    (dict(kind="tf_cnn_benchmarks", data="/data/imagenet train", steps=500),
     "python3 benchmarks/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py --model=resnet50 --batch_size=64 "
     "--variable_update=horovod --horovod_device=gpu --data_dir='/data/imagenet train' --data_name=imagenet "
     "--num_batches=500"),
    (dict(kind="mlperf_log", command="./run_and_time.sh --batch {{ batch_size }} --seed $SEED"),
     "./run_and_time.sh --batch 64 --seed $SEED"),
    (dict(kind="command", command="python3 train.py --batch-size {{ batch_size }} --tag {{ name }}",
          pattern=r"Total img/sec on \d+ CPU\(s\): ([\d.]+)"),
     "python3 train.py --batch-size 64 --tag b"),
    (dict(kind="command", command="echo {{ model }}", model="it's; rm -rf /", pattern="(x)"),
     "echo 'it'\"'\"'s; rm -rf /'"),
])  # fmt: skip
def test_program_per_kind(tmp_path, fields, program):
    [point] = plan_campaign(book(tmp_path, one_run(**fields)))
    line = point.jobs[0].command
    assert line.startswith("mpirun -np 1 --hostfile hostfile-b-nodes-1 " + MPIRUN_COMMON)
    assert line.endswith(" " + program)


@pytest.mark.parametrize("fields, program", [
    (dict(kind="pytorch_train"),
     "python3 pytorch_train.py --model resnet50 --batch-size 64 --precision fp32"),
    (dict(kind="pytorch_train", model="vit_b_16", precision="bf16", channels_last=True, compile=True, steps=20,
          python="/usr/bin/python3", args=["--image-size", "32"]),
     "/usr/bin/python3 pytorch_train.py --model vit_b_16 --batch-size 64 --precision bf16 --channels-last "
     "--compile --num-iters 20 --image-size 32"),
    (dict(kind="pytorch_train", data="/data/jpeg files", steps=5),
     "python3 pytorch_train.py --model resnet50 --batch-size 64 --precision fp32 --data-dir '/data/jpeg files' "
     "--num-iters 5"),
    (dict(kind="pytorch_train", program="/opt/my/train.py"),
     "python3 /opt/my/train.py --model resnet50 --batch-size 64 --precision fp32"),
    (dict(kind="pytorch_allreduce", steps=50, args=["-e", "1G"]),
     "python3 pytorch_allreduce.py -b 8 -e 128M -f 2 -n 50 -e 1G"),
])  # fmt: skip
def test_pytorch_workloads_under_mpirun_learn_where_rank_zero_is(tmp_path, fields, program):
    [point] = plan_campaign(book(tmp_path, one_run(nodes=[2], **fields)))
    line = point.jobs[0].command
    assert line.startswith("mpirun -np 2 --hostfile hostfile-b-nodes-2 --tag-output -bind-to none -map-by slot "
                           "-x LD_LIBRARY_PATH -x PATH -x MASTER_ADDR=10.0.0.1 -x MASTER_PORT=29500 -x NCCL_DEBUG=INFO")
    assert line.endswith(" " + program)


def test_values_are_quoted_so_the_shell_reads_them_back(tmp_path):
    nasty = "$(reboot); `id` & 'x' \"y\""
    [point] = plan_campaign(book(tmp_path, one_run(kind="nccl_allreduce", env={"NASTY": nasty}, args=[nasty])))
    words = shlex.split(point.jobs[0].command)
    assert f"NASTY={nasty}" in words and words[-1] == nasty


def test_weak_and_strong_scaling_batch_sizes(tmp_path):
    weak = plan_campaign(book(tmp_path, one_run(kind="horovod_synthetic", batch_size=1024, nodes=[1, 2, 4])))
    assert [p.jobs[0].batch_size for p in weak] == [1024, 1024, 1024]
    strong = plan_campaign(book(tmp_path, one_run(kind="horovod_synthetic", batch_size=1024, nodes=[1, 2, 4],
                                                   scaling="strong", gpus_per_vm=2)))
    assert [p.jobs[0].batch_size for p in strong] == [512, 256, 128]
    assert [p.jobs[0].np for p in strong] == [2, 4, 8]
    assert "--batch-size 128" in strong[2].jobs[0].command


def test_hostfile_and_nodes_taken_launcher_first(tmp_path):
    runbook = book(tmp_path, "launcher: vm3\n" + one_run(kind="nccl_allreduce", nodes=[1, 3], gpus_per_vm=2))
    one, three = plan_campaign(runbook)
    assert (one.guests, three.guests) == (("vm3",), ("vm3", "vm1", "vm2"))
    assert {j.launcher for j in one.jobs + three.jobs} == {"vm3"}
    assert render_hostfile(three.jobs[0].hosts) == "10.0.0.3 slots=2\n10.0.0.1 slots=2\n10.0.0.2 slots=2\n"
    assert (three.nodes, three.gpus_per_node, three.vms, three.jobs[0].np) == (3, 2, 3, 6)


def test_slots_of_guests_are_the_default_gpus_per_vm(tmp_path):
    infra = INFRA.replace("user: gpuadmin}, slots: 1}", "user: gpuadmin}, slots: 2}")
    [point] = plan_campaign(book(tmp_path, one_run(kind="nccl_allreduce", nodes=[3]), infra=infra))
    assert point.jobs[0].hosts == (("10.0.0.1", 2), ("10.0.0.2", 2), ("10.0.0.3", 2))


def test_root_login_gets_allow_run_as_root(tmp_path):
    [point] = plan_campaign(book(tmp_path, "launcher: vm4\n" + one_run(kind="nccl_allreduce")))
    assert point.jobs[0].command.startswith("mpirun --allow-run-as-root -np 1 ")
    [local] = plan_campaign(book(tmp_path, one_run(kind="nccl_allreduce")), local=True, local_root=False)
    assert local.jobs[0].command.startswith("mpirun -np 1 ")


def test_concurrent_groups_expand_to_one_job_per_vm(tmp_path):
    runbook = book(tmp_path, one_run(kind="tf_cnn_benchmarks", scenario="concurrent",
                                     groups=[["vm1"], ["vm1", "vm2"], ["vm1", "vm3"]], gpus_per_vm=2))
    solo, pair, spread = plan_campaign(runbook)
    assert (solo.label, solo.nodes, solo.gpus_per_node, solo.vms) == ("group-1-vm1", 1, 2, 1)
    assert (pair.label, pair.nodes, pair.gpus_per_node, pair.vms) == ("group-2-vm1+vm2", 1, 4, 2)
    assert (spread.nodes, spread.gpus_per_node, spread.vms) == (2, 2, 2)
    assert [(j.launcher, j.vm, j.hosts) for j in pair.jobs] == [
        ("vm1", "vm1", (("localhost", 2),)), ("vm2", "vm2", (("localhost", 2),))]
    assert all("-np 2 " in j.command and "--batch_size=64" in j.command for j in pair.jobs)


def test_container_runs_wrap_mpirun_in_docker(tmp_path):
    runbook = book(tmp_path, "container: true\ndocker_args: [-v, /data:/data]\n"
                   + one_run(kind="nccl_allreduce", nodes=[2]))
    [point] = plan_campaign(runbook)
    line = point.jobs[0].command
    from gpuvm.image import image_ref

    # the image guest.docker built (its name:recipe tag), run with the options that step defines, the
    # mesh user's ~/.ssh for the entrypoint to copy, the workdir at the same path
    assert line.startswith(
        "docker run --rm --name gpuvm-b-nodes-2 --network=host --ipc=host --cap-add=IPC_LOCK "
        "--gpus all -v /etc/ssh:/etc/ssh/vm:ro -v \"$HOME/.ssh:/etc/gpuvm/mesh:ro\" -v \"$PWD:$PWD\" -w \"$PWD\" "
        f"-v /data:/data {image_ref(runbook.guests.image)} mpirun --allow-run-as-root -np 2 ")
    assert image_ref(runbook.guests.image).startswith("gpuvm/dl:")
    assert "-mca plm_rsh_args '-p 12345'" in line
    assert point.jobs[0].container == "gpuvm-b-nodes-2"
    assert "docker rm -f gpuvm-b-nodes-2" in stop_script(".gpuvm-bench", point.jobs[0].container)


def test_containers_get_rdma_devices_and_gpus_only_where_there_are_some(tmp_path):
    infra = INFRA.replace("image: {name: gpuvm/dl, sshd_port: 12345}", "image: {name: gpuvm/dl, gpus: false}").replace(
        "- {vm: vm1, ssh: {address: 10.0.0.1, user: gpuadmin}, slots: 1}",
        "- {vm: vm1, ssh: {address: 10.0.0.1, user: gpuadmin}, slots: 1, rdma_ports: [{device: mlx5_0, port: 1}]}")
    runbook = book(tmp_path, "container: true\nlauncher: vm1\n" + one_run(kind="nccl_allreduce", nodes=[1]), infra)
    [point] = plan_campaign(runbook)
    assert "--device=/dev/infiniband" in point.jobs[0].command and "--gpus" not in point.jobs[0].command
    runbook = book(tmp_path, "container: true\nlauncher: vm2\n" + one_run(kind="nccl_allreduce", nodes=[1]), infra)
    [point] = plan_campaign(runbook)
    assert "--device=/dev/infiniband" not in point.jobs[0].command


def test_worker_container_scripts(tmp_path):
    from gpuvm.bench.commands import WORKER, worker_start_script, worker_stop_script
    from gpuvm.image import image_ref
    from gpuvm.runbook.guests import Image

    image = Image(gpus=False)
    script = worker_start_script(".gpuvm-bench", image, ["-v", "/data:/data"], 2222, rdma=False)
    start = script.index("docker run")
    run = shlex.split(script[start:script.index(" >/dev/null", start)])
    assert script.startswith(f"cd .gpuvm-bench && {{ docker rm -f {WORKER} ")  # a stale worker goes first
    assert run[:6] == ["docker", "run", "-d", "--rm", "--name", WORKER]
    assert run[-6:] == [image_ref(image), "/usr/sbin/sshd", "-D", "-e", "-p", "2222"]
    assert "$HOME/.ssh:/etc/gpuvm/mesh:ro" in run and "--gpus" not in run and "/data:/data" in run
    assert "grep -q 'Server listening'" in script and script.endswith("exit 1")
    assert worker_stop_script() == f"docker rm -f {WORKER} >/dev/null 2>&1; ! docker container inspect {WORKER} >/dev/null 2>&1"


def test_horovodrun_launcher(tmp_path):
    [point] = plan_campaign(book(tmp_path, one_run(kind="horovod_synthetic", launch="horovodrun", nodes=[2],
                                                    env={"NCCL_IB_HCA": "mlx5_0"})))
    assert point.jobs[0].command.startswith(
        "env NCCL_DEBUG=INFO 'NCCL_SOCKET_IFNAME=^lo,docker0' NCCL_IB_HCA=mlx5_0 horovodrun -np 2 "
        "-H 10.0.0.1:1,10.0.0.2:1 python3 tensorflow2_synthetic_benchmark.py")


def test_horovodrun_tells_the_pytorch_workload_where_rank_zero_is(tmp_path):
    [point] = plan_campaign(book(tmp_path, one_run(kind="pytorch_train", launch="horovodrun", nodes=[2])))
    assert point.jobs[0].command == (
        "env MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NCCL_DEBUG=INFO 'NCCL_SOCKET_IFNAME=^lo,docker0' horovodrun "
        "-np 2 -H 10.0.0.1:1,10.0.0.2:1 python3 pytorch_train.py --model resnet50 --batch-size 64 --precision fp32")


def test_torchrun_over_several_nodes_is_one_torchrun_per_node_started_by_mpirun(tmp_path):
    [point] = plan_campaign(book(tmp_path, one_run(kind="pytorch_train", launch="torchrun", nodes=[2], gpus_per_vm=4,
                                                    env={"GLOO_SOCKET_IFNAME": "eth0"},
                                                    mpirun_args=["-mca", "btl_tcp_if_include", "eth0"])))
    job = point.jobs[0]
    assert job.np == 8 and job.hosts == (("10.0.0.1", 4), ("10.0.0.2", 4))
    assert job.command == (
        "mpirun -np 2 --hostfile hostfile-b-nodes-2 -bind-to none -map-by ppr:1:node -x LD_LIBRARY_PATH -x PATH "
        "-mca pml ob1 -mca btl '^openib' -mca btl_tcp_if_include eth0 "
        "env NCCL_DEBUG=INFO 'NCCL_SOCKET_IFNAME=^lo,docker0' GLOO_SOCKET_IFNAME=eth0 "
        "python3 -m torch.distributed.run --nnodes 2 --nproc_per_node 4 "
        "--rdzv_backend c10d --rdzv_endpoint 10.0.0.1:29400 --rdzv_id b --no_python "
        "python3 pytorch_train.py --model resnet50 --batch-size 64 --precision fp32")
    assert "--tag-output" not in job.command  # torchrun's rank 0 may be on any node: lines stay untagged


def test_torchrun_on_one_node_runs_standalone_without_mpirun(tmp_path):
    runbook = book(tmp_path, one_run(kind="pytorch_allreduce", launch="torchrun", nodes=[1, 3], python="/usr/bin/python3",
                                     torchrun_args=["--redirects", "2", "--tee", "2"]))
    [here] = plan_campaign(runbook, local=True, only=["b"])[1:]
    assert here.jobs[0].command == (
        "env NCCL_DEBUG=INFO 'NCCL_SOCKET_IFNAME=^lo,docker0' /usr/bin/python3 -m torch.distributed.run --nnodes 1 "
        "--nproc_per_node 3 --standalone --redirects 2 --tee 2 --no_python /usr/bin/python3 "
        f"{Path(__file__).parents[2] / 'src/gpuvm/bench/workloads/pytorch_allreduce.py'} -b 8 -e 128M -f 2")


def test_launch_none_is_the_program_alone(tmp_path):
    [point] = plan_campaign(book(tmp_path, one_run(kind="pytorch_train", launch="none", env={"OMP_NUM_THREADS": 4})))
    assert point.jobs[0].command == (
        "env NCCL_DEBUG=INFO 'NCCL_SOCKET_IFNAME=^lo,docker0' OMP_NUM_THREADS=4 "
        "python3 pytorch_train.py --model resnet50 --batch-size 64 --precision fp32")
    assert launch_script("w", point.jobs[0].command).endswith(" && exec env NCCL_DEBUG=INFO "
                                                              "'NCCL_SOCKET_IFNAME=^lo,docker0' OMP_NUM_THREADS=4 "
                                                              "python3 pytorch_train.py --model resnet50 "
                                                              "--batch-size 64 --precision fp32 2>&1")


def test_only_selects_runs_and_names_unknown_ones(tmp_path):
    runbook = book(tmp_path, "runs:\n  - {name: a, kind: nccl_allreduce}\n  - {name: c, kind: nccl_allreduce}\n")
    assert [p.run.name for p in plan_campaign(runbook, only=["c"])] == ["c"]
    with pytest.raises(InputError, match=r"--only zz: no such benchmark \(the runbook has: a, c\)"):
        plan_campaign(runbook, only=["zz"])


def test_uploads_go_to_every_participant_once(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    runbook = book(tmp_path, "runs:\n"
                   "  - {name: a, kind: pytorch_train, nodes: [1, 2], upload: {train.py: scripts/train.py}}\n"
                   "  - {name: c, kind: pytorch_allreduce, nodes: [1]}\n"
                   "  - {name: d, kind: pytorch_train, nodes: [3], program: own.py}\n")
    found = {(u.target, u.destination) for u in uploads(runbook, plan_campaign(runbook), local=False)}
    assert found == {("vm1", "scripts/train.py"), ("vm2", "scripts/train.py"),
                     ("vm1", "pytorch_train.py"), ("vm2", "pytorch_train.py"), ("vm1", "pytorch_allreduce.py")}
    assert not uploads(runbook, plan_campaign(runbook, only=["d"]), local=False)  # its own program
    assert {u.destination for u in uploads(runbook, plan_campaign(runbook, local=True), local=True)} == \
        {"scripts/train.py"}  # --local runs the shipped files where they are


# ----------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("section, error", [
    ("runs:\n  - {name: a, kind: nccl_allreduce}\n  - {name: a, kind: nccl_allreduce}\n",
     r"lab\.yaml:\d+: benchmarks\.runs\[1\]\.name: benchmark 'a' is declared twice"),
    (one_run(kind="nccl_allreduce", nodes=[1, 5]),
     r"lab\.yaml:\d+: benchmarks\.runs\[0\]\.nodes\[1\]: 5 nodes, but the runbook has 4 guest\(s\)"),
    (one_run(kind="nccl_allreduce", scenario="concurrent", groups=[["vm1", "vm9"]]),
     r"benchmarks\.runs\[0\]\.groups\[0\]: 'vm9' is not a guest"),
    (one_run(kind="command", command="x", pattern=r"(\d+) (\d+)"),
     r"lab\.yaml:\d+: benchmarks\.runs\[0\]\.pattern: .* has 2 groups; give exactly one"),
    (one_run(kind="command", command="x", pattern="(oops"), r"is not a valid regular expression"),
    (one_run(kind="command", command="x"), r"kind command needs `pattern`"),
    (one_run(kind="command", pattern="(x)"), r"kind command needs `command`"),
    (one_run(kind="nccl_allreduce", pattern="(x)"), r"`pattern` is read only with kind command"),
    (one_run(kind="nccl_allreduce", batch_size=100, nodes=[1, 3], scaling="strong"),
     r"benchmarks\.runs\[0\]\.batch_size: strong scaling splits the global batch 100 over 3 GPU\(s\)"),
    ("launcher: vm9\n" + one_run(kind="nccl_allreduce"), r"benchmarks\.launcher: 'vm9' is not a guest"),
    (one_run(kind="nccl_allreduce", nodes=[2, 2]), r"node counts repeat"),
    (one_run(kind="nccl_allreduce", groups=[["vm1"]]), r"`groups` is for scenario concurrent"),
    (one_run(kind="nccl_allreduce", scenario="concurrent", groups=[["vm1"], ["vm2"]]),
     r"groups\[1\]: same configuration as group 1"),
    (one_run(kind="nccl_allreduce", env={"BAD-NAME": "1"}), r"'BAD-NAME' is not an environment variable name"),
    (one_run(kind="nccl_allreduce", upload={"missing.py": "x.py"}),
     r"benchmarks\.runs\[0\]\.upload\.missing\.py: .*missing\.py: cannot read upload: No such file"),
    (one_run(kind="command", command="run {{ nope }}", pattern="(x)"),
     r"benchmarks\.runs\[0\]\.command: cannot render: 'nope' is undefined \(variables: .*batch_size"),
    (one_run(kind="nccl_allreduce", color="red"), r"benchmarks\.runs\[0\]\.color: unknown field"),
    (one_run(kind="tpu"), r"benchmarks\.runs\[0\]\.kind: Input should be 'pytorch_train'"),
    (one_run(kind="tf_cnn_benchmarks", precision="bf16"),
     r"benchmarks\.runs\[0\]: .*precision bf16 is read only with kind pytorch_train"),
    (one_run(kind="pytorch_allreduce", channels_last=True), r"`channels_last` is read only with kind pytorch_train"),
    (one_run(kind="horovod_synthetic", compile=True), r"`compile` is read only with kind pytorch_train"),
    (one_run(kind="pytorch_train", precision="fp8"), r"benchmarks\.runs\[0\]\.precision: Input should be 'fp32'"),
    (one_run(kind="pytorch_train", launch="qsub"),
     r"benchmarks\.runs\[0\]\.launch: Input should be 'mpirun', 'torchrun', 'horovodrun', 'srun', 'sbatch' or 'none'"),
    (one_run(kind="pytorch_train", launch="none", mpirun_args=["-x", "A"]),
     r"`mpirun_args` is read only with launch: mpirun or torchrun"),
    (one_run(kind="pytorch_train", torchrun_args=["--max_restarts", "1"]),
     r"`torchrun_args` is read only with launch: torchrun"),
    (one_run(kind="pytorch_train", launch="none", nodes=[1, 2]),
     r"lab\.yaml:\d+: benchmarks\.runs\[0\]\.launch: launch: none starts one process, but 2 node\(s\) x 1 GPU\(s\)"),
    (one_run(kind="pytorch_train", launch="none", scenario="concurrent", groups=[["vm1"]], gpus_per_vm=2),
     r"benchmarks\.runs\[0\]\.launch: launch: none starts one process, but 1 node\(s\) x 2 GPU\(s\)"),
    ("runs: []\n", r"benchmarks\.runs: List should have at least 1 item"),
])  # fmt: skip
def test_bad_benchmarks_name_file_line_and_field(tmp_path, section, error):
    with pytest.raises(InputError, match=error):
        plan_campaign(book(tmp_path, section))


def test_container_needs_an_image(tmp_path):
    infra = INFRA.replace("  image: {name: gpuvm/dl, sshd_port: 12345}\n", "")
    with pytest.raises(InputError, match=r"lab\.yaml:\d+: benchmarks\.container: container: true needs guests\.image"):
        plan_campaign(book(tmp_path, "container: true\n" + one_run(kind="nccl_allreduce"), infra=infra))


def test_local_refuses_concurrent_and_needs_no_guests(tmp_path):
    with pytest.raises(InputError, match=r"scenario: concurrent runs need guests"):
        plan_campaign(book(tmp_path, one_run(kind="nccl_allreduce", scenario="concurrent", groups=[["vm1"]])),
                      local=True)
    bare = book(tmp_path, one_run(kind="nccl_allreduce", nodes=[1, 8]), infra="")
    assert [p.jobs[0].hosts for p in plan_campaign(bare, local=True)] == [(("localhost", 1),), (("localhost", 8),)]
    with pytest.raises(InputError, match=r"benchmarks run on guests: add guests\.hosts \(or pass --local\)"):
        plan_campaign(bare)


def test_no_benchmarks_section(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(INFRA)
    with pytest.raises(InputError, match=r"lab\.yaml:1: benchmarks: the runbook has no `benchmarks` section"):
        plan_campaign(load_runbook(path))


# ------------------------------------------------------------------------------ the campaign


def horovod_output(total: float, workers: int = 1) -> str:
    return (f"[1,0]<stdout>:Model: ResNet50\n[1,0]<stdout>:Iter #0: {total / workers:.1f} img/sec per GPU\n"
            f"[1,0]<stdout>:Total img/sec on {workers} GPU(s): {total:.1f} +-1.0\n")


def ok(stdout: str = "") -> CommandResult:
    return CommandResult("", 0, stdout, "")


class Script:
    """A fake launcher: answers each mpirun from a queue of results (or exceptions to raise)."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def __call__(self, call):
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def fake(name: str, launch=None) -> FakeExecutor:
    responses = {re.compile(r"exec mpirun|exec docker run"): launch or (lambda call: ok(horovod_output(100.0)))}
    responses.update({
        re.compile(r"^mpirun --version"): ok("mpirun (Open MPI) 4.1.2\n\nReport bugs\n"),
        re.compile(r"^python3 --version"): ok("Python 3.8.10\n"),
        re.compile(r"^nvidia-smi"): ok("470.82.01\n"),
        re.compile(r"^docker image inspect"): ok("sha256:" + "a" * 64 + "\n"),
        re.compile(r"^mkdir -p"): ok(),
        re.compile(r"pid=\$\(cat"): ok(),
        re.compile(r"(test -e|command -v) .* \|\| echo"): ok(),  # every program is there
    })
    return FakeExecutor(name, responses)


def campaign(tmp_path, section: str, executors: dict, **kwargs):
    runbook = book(tmp_path, section)
    points = plan_campaign(runbook, **kwargs)
    runner = CampaignRunner(runbook, points, executors, tmp_path / "results", local=kwargs.get("local", False))
    runner.prepare()
    return runner.run(), runner


def test_campaign_writes_results_logs_hostfiles_and_versions(tmp_path):
    # repeats run round-robin: 1 node, 2 nodes, 1 node, 2 nodes
    vm1, vm2 = fake("vm1", Script(ok(horovod_output(100.0)), ok(horovod_output(195.0, 2)),
                                  ok(horovod_output(101.0)), ok(horovod_output(197.0, 2)))), fake("vm2")
    (tmp_path / "train.py").write_text("x")
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", nodes=[1, 2], repeats=2,
                                         upload={"train.py": "train.py"}), {"vm1": vm1, "vm2": vm2})
    assert not done.failures and not done.interrupted and done.runs_done == 2 * 2
    results = load_results(done.results_file)
    assert results.environment == "vm"
    assert results.runbook.sha256 and results.runbook.path.endswith("lab.yaml")
    assert results.hosts == ["esx-01"]
    assert [(v.name, v.gpus, v.cpus) for v in results.vms] == [("vm1", 2, 32), ("vm2", 2, 32)]
    assert results.software["vm1"] == {"mpirun": "mpirun (Open MPI) 4.1.2", "python": "Python 3.8.10",
                                       "nvidia_driver": "470.82.01"}
    [bench] = results.benchmarks
    assert (bench.unit, bench.scaling) == ("img/sec", "weak")
    assert [[r.value for r in p.repeats] for p in bench.points] == [[100.0, 101.0], [195.0, 197.0]]
    assert bench.points[1].repeats[0].log == "logs/b/nodes-2/repeat-1.log"
    log = done.directory / "logs" / "b" / "nodes-2" / "repeat-1.log"
    assert "Total img/sec on 2 GPU(s): 195.0" in log.read_text()
    assert vm1.files[".gpuvm-bench/hostfile-b-nodes-2"][0] == b"10.0.0.1 slots=1\n10.0.0.2 slots=1\n"
    assert vm2.files[".gpuvm-bench/train.py"][0] == b"x"  # uploads reach every participant
    assert ".gpuvm-bench/hostfile-b-nodes-2" not in vm2.files  # hostfiles only on the launcher
    launches = [c for c in vm1.calls if "exec mpirun" in c.command]
    assert re.match(r"cd \.gpuvm-bench && rm -f gpuvm-run\*\.pid && echo \$\$ > gpuvm-run-\w+\.pid && exec mpirun ",
                    launches[0].command)
    assert launches[0].command.endswith(" 2>&1") and launches[0].timeout == 3600 + 60  # the runner's own timer stops it first
    speedup = compare(results).benchmarks[0].points[1].speedup
    assert speedup == pytest.approx(196.0 / 100.5)


def test_failed_runs_are_recorded_and_the_campaign_goes_on(tmp_path):
    vm1 = fake("vm1", Script(
        CommandResult("", 1, "[1,0]<stderr>:CUDA error: out of memory\n", ""),  # non-zero exit
        ok("[1,0]<stdout>:nothing useful\n"),  # no figure
        RemoteCommandError("vm1: `mpirun ...` timed out after 5s; the command was stopped"),
        ok(horovod_output(100.0)),
    ))
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", repeats=4, timeout=5), {"vm1": vm1})
    assert [f.repeat for f in done.failures] == [1, 2, 3]
    repeats = load_results(done.results_file).benchmarks[0].points[0].repeats
    assert [r.value for r in repeats] == [None, None, None, 100.0]
    assert repeats[0].error == "exited 1: [1,0]<stderr>:CUDA error: out of memory"
    assert "no 'Total img/sec on N GPU(s)' line found" in repeats[1].error
    assert "logs/b/nodes-1/repeat-2.log" in repeats[1].error
    assert "timed out after 5s" in repeats[2].error
    stops = [c for c in vm1.calls if c.command.startswith("pid=$(cat")]
    assert len(stops) == 1  # the timed-out job's process group was stopped
    assert "env kill -TERM -- -$pid" in stops[0].command
    with pytest.raises(Exception) as info:
        done.raise_for_failures()
    message = str(info.value)
    assert "3 of 4 benchmark run(s) failed" in message
    assert "b at nodes-1, repeat 3: vm1: `mpirun ...` timed out after 5s" in message
    assert "(log: logs/b/nodes-1/repeat-1.log)" in message
    assert info.value.exit_code == 6
    assert compare(load_results(done.results_file)).benchmarks[0].points[0].spread.repeats == 1


def test_timeout_stops_the_job_with_term_and_is_recorded(tmp_path):
    import threading

    stopped = threading.Event()

    def hang(call):  # a job that runs until it is stopped
        assert stopped.wait(10)
        return CommandResult("", 143, "[1,0]<stdout>:Iter #0: 1.0 img/sec per GPU\n", "")

    def stop(call):
        stopped.set()
        return ok()

    vm1 = fake("vm1", hang)
    vm1.responses[re.compile(r"pid=\$\(cat")] = stop
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", repeats=1, timeout=0.3), {"vm1": vm1})
    [failure] = done.failures
    assert failure.error == "timed out after 0.3s; the job was stopped: [1,0]<stdout>:Iter #0: 1.0 img/sec per GPU"
    assert load_results(done.results_file).benchmarks[0].points[0].repeats[0].value is None


def test_ctrl_c_stops_the_job_and_keeps_what_was_measured(tmp_path):
    vm1 = fake("vm1", Script(ok(horovod_output(100.0)), ok(horovod_output(102.0)), KeyboardInterrupt()))
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", nodes=[1, 2], repeats=2), {"vm1": vm1, "vm2": fake("vm2")})
    assert done.interrupted and done.runs_done == 2 and not done.failures
    results = load_results(done.results_file)
    assert results.note == "interrupted: 2 of 4 run(s) done"
    # round-robin: the first repeat of each point ran before Ctrl-C
    assert [(p.nodes, [r.value for r in p.repeats]) for p in results.benchmarks[0].points] == [(1, [100.0]), (2, [102.0])]
    launched, stopped = [c.command for c in vm1.calls][-2:]
    pidfile = re.search(r"echo \$\$ > (gpuvm-run-[0-9a-f]{8}\.pid)", launched).group(1)
    assert stopped.startswith(f"pid=$(cat .gpuvm-bench/{pidfile} 2>/dev/null)")


def test_warm_up_runs_are_logged_not_recorded(tmp_path):
    vm1 = fake("vm1", Script(ok(horovod_output(10.0)), ok(horovod_output(100.0))))
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", repeats=1, warmup=1), {"vm1": vm1})
    assert [r.value for r in load_results(done.results_file).benchmarks[0].points[0].repeats] == [100.0]
    assert (done.directory / "logs" / "b" / "nodes-1" / "warmup-1.log").exists()


def test_concurrent_point_sums_the_vms(tmp_path):
    executors = {"vm1": fake("vm1", lambda c: ok(horovod_output(2700.0))),
                 "vm2": fake("vm2", lambda c: ok(horovod_output(2600.0)))}
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", scenario="concurrent",
                                         groups=[["vm1", "vm2"]], repeats=1, gpus_per_vm=1), executors)
    [point] = load_results(done.results_file).benchmarks[0].points
    assert (point.nodes, point.gpus_per_node, point.vms) == (1, 2, 2)
    assert point.repeats[0].value == 5300.0 and point.repeats[0].per_vm == {"vm1": 2700.0, "vm2": 2600.0}
    assert point.repeats[0].log == "logs/b/group-1-vm1+vm2/repeat-1/"
    assert (done.directory / point.repeats[0].log / "vm2.log").read_text() == horovod_output(2600.0)
    assert compare(load_results(done.results_file)).benchmarks[0].points[0].label == "2 VMs × 1 GPU"


def test_secrets_never_reach_logs_or_results(tmp_path):
    secret = remember("s3cr3t-token-value")
    vm1 = fake("vm1", lambda c: CommandResult("", 2, f"auth with {secret} failed\n", ""))
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", repeats=1), {"vm1": vm1})
    text = (done.directory / "logs" / "b" / "nodes-1" / "repeat-1.log").read_text()
    assert secret not in text and "********" in text
    assert secret not in done.results_file.read_text()


def test_command_kind_and_mlperf_units(tmp_path):
    vm1 = fake("vm1", lambda c: ok("[1,0]<stdout>:throughput: 1,234.5 samples/s\n"))
    done, _ = campaign(tmp_path, one_run(kind="command", command="./bench", pattern=r"throughput: ([\d,.]+)",
                                         unit="samples/s", repeats=1), {"vm1": vm1})
    bench = load_results(done.results_file).benchmarks[0]
    assert (bench.unit, bench.points[0].repeats[0].value) == ("samples/s", 1234.5)
    vm1 = fake("vm1", lambda c: CommandResult("", 1, "", ""))
    done, _ = campaign(tmp_path, one_run(kind="mlperf_log", command="./run.sh", repeats=1), {"vm1": vm1})
    bench = load_results(done.results_file).benchmarks[0]
    assert (bench.unit, bench.higher_is_better, bench.points[0].repeats[0].error) == ("min", False, "exited 1")


def test_local_campaign_runs_in_the_results_workdir(tmp_path):
    local = fake(LOCAL)
    done, runner = campaign(tmp_path, one_run(kind="horovod_synthetic", repeats=1, nodes=[2]), {LOCAL: local},
                            local=True, local_root=True)
    results = load_results(done.results_file)
    assert results.environment == "bare-metal" and results.vms == []
    workdir = str((tmp_path / "results" / "work").resolve())
    assert local.files[workdir + "/hostfile-b-nodes-2"][0] == b"localhost slots=2\n"
    launch = next(c.command for c in local.calls if "exec mpirun" in c.command)
    assert launch.startswith(f"cd {workdir} && rm -f gpuvm-run*.pid && echo $$ > gpuvm-run-")
    assert " && exec mpirun --allow-run-as-root -np 2 " in launch


def test_local_results_name_this_machine_and_the_launcher(tmp_path, mocker):
    mocker.patch("gpuvm.bench.recording.socket.gethostname", return_value="dgx-h100-07")
    local = fake(LOCAL)
    done, _ = campaign(tmp_path, one_run(kind="pytorch_train", repeats=1), {LOCAL: local}, local=True)
    results = load_results(done.results_file)
    assert results.hosts == ["dgx-h100-07"] and results.environment == "bare-metal"
    assert results.benchmarks[0].launch == "mpirun" and results.benchmarks[0].unit == "img/sec"


def test_a_program_absent_on_guests_fails_before_anything_runs_naming_each_guest_and_path(tmp_path):
    def missing(executor, *paths):  # the guest's answer to the check: the paths it lacks
        [check] = [k for k in executor.responses if isinstance(k, re.Pattern) and "test -e" in k.pattern]
        executor.responses[check] = lambda call: ok("".join(f"{p}\n" for p in paths if p in call.command))

    vm1, vm2, vm3 = fake("vm1"), fake("vm2"), fake("vm3")
    missing(vm1, "./tf_cnn_benchmarks.py")
    missing(vm2, "./tf_cnn_benchmarks.py", "/opt/nccl/all_reduce_perf")
    section = ("runs:\n"
               "  - {name: tf, kind: tf_cnn_benchmarks, program: tf_cnn_benchmarks.py, nodes: [2]}\n"
               "  - {name: ar, kind: nccl_allreduce, program: /opt/nccl/all_reduce_perf, nodes: [3]}\n")
    runbook = book(tmp_path, section)
    runner = CampaignRunner(runbook, plan_campaign(runbook), {"vm1": vm1, "vm2": vm2, "vm3": vm3}, tmp_path / "r")
    with pytest.raises(TargetFailures) as failed:
        runner.prepare()
    assert set(failed.value.failures) == {"vm1", "vm2"}
    message = str(failed.value)
    assert ("vm1: ./tf_cnn_benchmarks.py: no such file in .gpuvm-bench (benchmark 'tf')") in message
    assert ("vm2: ./tf_cnn_benchmarks.py: no such file in .gpuvm-bench (benchmark 'tf'); "
            "/opt/nccl/all_reduce_perf: no such file (benchmark 'ar')") in message
    assert failed.value.exit_code == 2
    checks = [c.command for c in vm3.calls if "|| echo" in c.command]
    assert checks == ["cd .gpuvm-bench && { test -e /opt/nccl/all_reduce_perf >/dev/null 2>&1 || "
                      "echo /opt/nccl/all_reduce_perf; }"]  # one script per guest, only what its runs need
    assert not any("exec mpirun" in c.command for ex in (vm1, vm2, vm3) for c in ex.calls)


@pytest.mark.parametrize("fields, needed", [
    (dict(kind="pytorch_train"), ["python3"]),  # the shipped file is uploaded
    (dict(kind="pytorch_train", program="bin/train.py", python="/usr/bin/python3"), ["bin/train.py", "/usr/bin/python3"]),
    (dict(kind="horovod_synthetic", framework="pytorch"), ["./pytorch_synthetic_benchmark.py", "python3"]),
    (dict(kind="nccl_allreduce"), ["all_reduce_perf"]),  # a name: looked up on PATH
    (dict(kind="command", command="./run.sh", pattern="(x)"), []),  # shell text: the user's own
])  # fmt: skip
def test_what_a_run_needs_on_each_guest(tmp_path, fields, needed):
    from gpuvm.bench.runner import _programs

    [point] = plan_campaign(book(tmp_path, one_run(**fields)))
    assert _programs(point.run, containerised=False) == needed
    assert _programs(point.run, containerised=True) == [p for p in needed if p.startswith(("./", "bin/"))]


def test_describe_is_the_dry_run(tmp_path):
    points = plan_campaign(book(tmp_path, one_run(kind="nccl_allreduce", nodes=[2], warmup=1)))
    lines = describe(points, ".gpuvm-bench")
    assert lines[0] == "b nodes-2: 3 repeat(s) after 1 warm-up(s)"
    assert lines[1] == "  on vm1 (hostfile hostfile-b-nodes-2: 10.0.0.1 slots=1, 10.0.0.2 slots=1)"
    assert lines[2] == "    " + launch_script(".gpuvm-bench", points[0].jobs[0].command)


def test_cli_dry_run_and_errors(tmp_path):
    import typer

    from gpuvm.cli.bench_run import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps `run` a sub-command
    book(tmp_path, one_run(kind="nccl_allreduce", nodes=[1, 2]))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "lab.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "b nodes-2: 3 repeat(s)" in result.output and "exec mpirun -np 2" in result.output
    result = CliRunner().invoke(app, ["run", str(tmp_path / "lab.yaml"), "--only", "nope", "--dry-run"])
    assert result.exit_code == 2 and "--only nope: no such benchmark" in result.output


# ------------------------------------------------------------------------ results with failures


def test_repeat_has_a_value_or_an_error():
    assert Repeat(error="exited 1").ok is False
    with pytest.raises(ValueError, match="either a value or an error"):
        Repeat()
    with pytest.raises(ValueError, match="either a value or an error"):
        Repeat(value=1.0, error="x")


def test_compare_skips_failed_repeats_and_empty_points():
    bench = Benchmark(name="b", kind="command", points=[
        Point(nodes=1, repeats=[Repeat(error="exited 1")]),
        Point(nodes=2, repeats=[Repeat(value=200.0), Repeat(error="timed out")]),
        Point(nodes=4, repeats=[Repeat(value=380.0)]),
    ])  # fmt: skip
    [b] = compare(Results(environment="vm", benchmarks=[bench])).benchmarks
    assert [(p.nodes, p.spread.repeats) for p in b.points] == [(2, 1), (4, 1)]
    assert b.reference_nodes == 2 and b.points[1].speedup == pytest.approx(1.9)
    nothing = Benchmark(name="n", kind="command", points=[Point(nodes=1, repeats=[Repeat(error="x")])])
    assert compare(Results(environment="vm", benchmarks=[nothing])).benchmarks[0].points == []


def test_software_versions_of_a_containerised_campaign_name_the_image(tmp_path):
    """The image built by guest.docker is probed by its recipe tag (a NameError once hid here)."""
    import re as _re

    from gpuvm.bench.software import software_versions
    from gpuvm.executors.base import CommandResult
    from gpuvm.executors.fake import FakeExecutor
    from gpuvm.runbook.guests import Image
    from gpuvm.image import image_ref

    image = Image()
    fake = FakeExecutor("g1", {
        "mpirun --version": CommandResult("", 0, "mpirun (Open MPI) 4.1.4\n\nReport bugs", ""),
        _re.compile(r"^docker image inspect"): CommandResult("", 0, "sha256:abc\n", ""),
    })
    found = software_versions({"g1": fake}, ["g1"], image)
    assert found["g1"] == {"mpirun": "mpirun (Open MPI) 4.1.4", "image_name": image_ref(image), "image": "sha256:abc"}
    assert f"docker image inspect --format '{{{{.Id}}}}' {image_ref(image)}" in fake.commands


def container_fake(name: str, launch=None, worker=ok()) -> FakeExecutor:
    executor = fake(name, launch)
    executor.responses[re.compile(r"docker run -d --rm --name gpuvm-worker ")] = worker
    executor.responses[re.compile(r"^docker rm -f gpuvm-worker ")] = ok()
    return executor


def test_containerised_campaign_starts_workers_first_and_removes_them_at_the_end(tmp_path):
    vm1, vm2 = container_fake("vm1"), container_fake("vm2")
    done, _ = campaign(tmp_path, "container: true\n" + one_run(kind="horovod_synthetic", nodes=[2]),
                       {"vm1": vm1, "vm2": vm2})
    assert not done.failures and load_results(done.results_file).note is None
    for executor in (vm1, vm2):
        commands = [c.command for c in executor.calls]
        start = next(i for i, c in enumerate(commands) if "docker run -d --rm --name gpuvm-worker" in c)
        stop = next(i for i, c in enumerate(commands) if c.startswith("docker rm -f gpuvm-worker"))
        assert "sshd -D -e -p 12345" in commands[start] and start < stop == len(commands) - 1
    commands = [c.command for c in vm1.calls]
    launch = next(i for i, c in enumerate(commands) if "exec docker run --rm --name gpuvm-b-nodes-2" in c)
    assert next(i for i, c in enumerate(commands) if "gpuvm-worker" in c) < launch < len(commands) - 1


def test_workers_are_removed_after_ctrl_c_and_a_worker_that_fails_stops_the_campaign(tmp_path):
    vm1, vm2 = container_fake("vm1", Script(KeyboardInterrupt())), container_fake("vm2")
    done, _ = campaign(tmp_path, "container: true\n" + one_run(kind="horovod_synthetic", nodes=[2]),
                       {"vm1": vm1, "vm2": vm2})
    assert done.interrupted
    assert all(any(c.command.startswith("docker rm -f gpuvm-worker") for c in e.calls) for e in (vm1, vm2))

    vm1 = container_fake("vm1")
    vm2 = container_fake("vm2", worker=CommandResult("", 1, "sshd: no hostkeys available -- exiting.\n", ""))
    with pytest.raises(RemoteCommandError, match=r"cannot start the worker containers \(sshd\): vm2: sshd: no hostkeys"):
        campaign(tmp_path, "container: true\n" + one_run(kind="horovod_synthetic", nodes=[2]), {"vm1": vm1, "vm2": vm2})
    assert not any("exec docker run --rm" in c.command for c in vm1.calls)  # nothing ran
    assert all(any(c.command.startswith("docker rm -f gpuvm-worker") for c in e.calls) for e in (vm1, vm2))


def test_containers_across_guests_need_the_mesh_container_port(tmp_path):
    infra = INFRA.replace("  ssh_mesh: {container_port: 12345}\n", "")
    with pytest.raises(InputError, match=r"benchmarks.container: .*guests.ssh_mesh.container_port"):
        book(tmp_path, "container: true\n" + one_run(kind="horovod_synthetic", nodes=[1, 2]), infra)
    book(tmp_path, "container: true\n" + one_run(kind="horovod_synthetic", nodes=[1]), infra)  # one guest: no ssh
