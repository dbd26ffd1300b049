"""The runbook's `benchmarks` section: what to run, where, how often (typed, checked up front).

    benchmarks:
      launcher: gpu-vm-01          # guest that starts mpirun (default: the first guest)
      container: false             # true: mpirun runs inside guests.image (docker run --network=host ...)
      runs:
        - name: resnet50-scaling
          kind: pytorch_train      # pytorch_train | pytorch_allreduce (shipped with gpuvm) | tf_cnn_benchmarks |
                                   # horovod_synthetic | nccl_allreduce | mlperf_log | command |
                                   # storage (fio random reads in `data`, once per guest: launch none)
          batch_size: 256          # per GPU (strong scaling: the global batch)
          precision: bf16          # fp32 | fp16 | bf16 (bf16: pytorch_train only)
          nodes: [1, 2, 4]         # guests used, launcher first, then runbook order
          launch: torchrun         # mpirun (default) | torchrun | horovodrun | srun, sbatch (through Slurm) | none
          setups: [two-vms]        # the setups it runs in (default: all); see runbook/setups.py
          network_mapping: [on, off]   # each point with and without the derived NCCL/MPI network
        - name: resnet50-data-path
          kind: pytorch_train
          data: /mnt/datasets/jpegs  # train on the JPEG files there (default: synthetic tensors)
          dataset: {files: 10000, file_kb: 110}   # gpuvm writes them where missing (a marker records what)
          compare_synthetic: true  # each point on the files and on synthetic tensors: the data path's overhead
      setups:                      # VM/GPU layouts applied one after the other
        - {name: two-vms, vms: [{name: gpu-vm-01, gpus: {mode: passthrough, count: 1}}, {name: gpu-vm-02}]}

Field-level checks live on the models (pydantic, so errors carry file:line); checks that need the
rest of the runbook (guest names, node counts, batch divisibility, upload files) are in
`check_benchmarks`, run before anything is touched.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gpuvm.errors import InputError, listed
from gpuvm.files import UPLOAD_BYTES, check_capped
from gpuvm.runbook.strict import Seconds, Strict, checked_name, shown

if TYPE_CHECKING:
    from gpuvm.runbook.guests import Guest
    from gpuvm.runbook.model import Runbook

Kind = Literal["pytorch_train", "pytorch_allreduce", "tf_cnn_benchmarks", "horovod_synthetic", "nccl_allreduce",
               "mlperf_log", "command", "storage"]
Launch = Literal["mpirun", "torchrun", "horovodrun", "srun", "sbatch", "none"]
SLURM_LAUNCHES = ("srun", "sbatch")  # through the guests' Slurm: srun on the submit guest, or a batch job
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _one_line(value: str, what: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError(f"{what} must be one line")
    return value


class Dataset(Strict):
    """JPEG files gpuvm writes into a run's `data` directory on the guests that read it, where missing
    (pytorch_train.py --write-dataset: random pixels, each file about `file_kb` KB)."""

    files: int = Field(ge=1, le=100_000_000)  # how many JPEG files
    file_kb: float = Field(gt=0, le=100_000)  # each about this size, KB


class BenchmarkRun(Strict):
    """One benchmark: a kind of program, its settings, and the points (node counts or VM groups)."""

    name: str  # names the benchmark in results.json, compare and report
    kind: Kind  # the program and the parser of its output
    framework: Literal["tensorflow", "pytorch"] | None = None  # horovod_synthetic only
    model: str | None = None  # default per kind: resnet50 (TF2 Keras: ResNet50)
    batch_size: int = Field(default=64, ge=1)  # per GPU; strong scaling: global
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"  # fp16, bf16: mixed precision
    channels_last: bool = False  # pytorch_train: NHWC memory format
    compile: bool = False  # pytorch_train: torch.compile (PyTorch 2)
    data: str = "synthetic"  # or a data directory on the guests (tf_cnn_benchmarks --data_dir, pytorch_train --data-dir)
    dataset: Dataset | None = None  # pytorch_train: files gpuvm writes into `data` where missing
    compare_synthetic: bool = False  # pytorch_train with `data`: each point also on synthetic tensors
    steps: int | None = Field(default=None, ge=1)  # timed steps: --num_batches / --num-iters
    scenario: Literal["scaling", "concurrent"] = "scaling"  # one job over N VMs, or groups of VMs with a job each
    scaling: Literal["weak", "strong"] | None = None  # scenario scaling: default weak
    nodes: list[Annotated[int, Field(ge=1, le=1024)]] | None = None  # scaling: default [1]
    groups: list[list[str]] | None = None  # concurrent: VMs each running their own job at once
    gpus_per_vm: int | None = Field(default=None, ge=1, le=16)  # default: each guest's `slots` (default: its VM's gpus.count)
    # auto: repeat until the median's 95 % interval is within ± repeats_target of it (3 at least),
    # or repeats_max runs (bench/stats.py says how the interval is computed)
    repeats: Annotated[int, Field(ge=1, le=100)] | Literal["auto"] = 3
    repeats_target: float = Field(default=0.01, gt=0, lt=1)  # auto: half-width of the interval, a fraction
    repeats_max: int = Field(default=20, ge=3, le=100)  # auto: the cap
    warmup: int = Field(default=0, ge=0, le=10)  # whole runs first, discarded
    timeout: Seconds = 3600  # seconds, per run
    env: dict[str, str] = {}  # exported to every rank (mpirun -x NAME=VALUE)
    program: str | None = None  # the script or binary (default per kind)
    python: str = "python3"  # interpreter for Python programs
    args: list[str] = []  # extra arguments for the program
    command: str | None = None  # the whole program line (shell text; jinja2 variables allowed)
    pattern: str | None = None  # kind command: regular expression with one group
    unit: str = ""  # kind command: unit of the captured figure
    higher_is_better: bool = True  # kind command
    upload: dict[str, str] = {}  # local file → path in the workdir of every participating guest
    mpirun_args: list[str] = []  # extra mpirun words, e.g. ["-mca", "btl_tcp_if_include", "10.0.0.0/24"]
    torchrun_args: list[str] = []  # extra torchrun words, e.g. ["--max_restarts", "0"]
    launch: Launch = "mpirun"  # the launcher (templates/bench/<launch>.j2); none: one process, no launcher
    # launch srun, sbatch: srun's --mpi (how MPI programs find their ranks); default: the cluster's MpiDefault
    srun_mpi: Literal["pmix", "pmi2", "none"] | None = None
    # launch srun: extra srun words, e.g. ["--partition", "gpu"]; sbatch: extra sbatch words (the allocation's)
    srun_args: list[str] = []
    # launch srun, sbatch: seconds Slurm may keep the job pending (srun --immediate; sbatch: then scancel)
    queue_timeout: Seconds = 300
    setups: list[str] | None = None  # the campaign's setups this run is measured in; default all
    # each point with the network derived from the guests' rdma_ports ("on") and without ("off");
    # left out: derived where the guests configure ports, points not labelled
    network_mapping: list[Literal["on", "off"]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _storage_runs_alone(cls, data: Any) -> Any:
        """fio is one process per guest: `launch` defaults to none for kind storage."""
        if isinstance(data, dict) and data.get("kind") == "storage" and "launch" not in data:
            return {**data, "launch": "none"}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_name(value)

    @property
    def most_repeats(self) -> int:
        """The repeats each point runs at most: `repeats`, or `repeats_max` with auto."""
        return self.repeats_max if self.repeats == "auto" else self.repeats

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        out = {}
        for name, item in value.items():
            if not isinstance(name, str) or not ENV_NAME.match(name):
                raise ValueError(f"'{name}' is not an environment variable name")
            if isinstance(item, bool):
                item = "1" if item else "0"
            if not isinstance(item, str | int | float):
                raise ValueError(f"{name}: expected a string or number, got {type(item).__name__}")
            out[name] = _one_line(str(item), f"env {name}")
        return out

    @field_validator("command", "program", "python", "data", "model")
    @classmethod
    def _single_line(cls, value: str | None) -> str | None:
        if value is not None:
            _one_line(value, "the value")
            if not value.strip():
                raise ValueError("must not be empty")
        return value

    @field_validator("command")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        """A jinja2 template: its syntax is checked at load (it renders in the sandbox at run time)."""
        import jinja2
        import jinja2.sandbox

        if value is not None:
            try:
                jinja2.sandbox.ImmutableSandboxedEnvironment().parse(value)
            except jinja2.TemplateSyntaxError as e:
                raise ValueError(f"not a valid template: {e.message}") from None
        return value

    @field_validator("upload")
    @classmethod
    def _upload(cls, value: dict[str, str]) -> dict[str, str]:
        for source, destination in value.items():
            path = PurePosixPath(_one_line(destination, f"upload {source}"))
            if path.is_absolute() or ".." in path.parts or not path.parts:
                raise ValueError(f"upload {source} → {shown(destination)}: give a path inside the workdir "
                                 "(relative, without '..')")
        return value

    @field_validator("args", "mpirun_args", "torchrun_args", "srun_args")
    @classmethod
    def _words(cls, value: list[str]) -> list[str]:
        for word in value:
            _one_line(word, f"'{word[:20]}'")
        return value

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value:
                raise ValueError("give at least one node count, such as [1, 2, 4]")
            if len(set(value)) != len(value):
                raise ValueError(f"node counts repeat in {value}; put runs in `repeats`")
        return value

    @field_validator("setups", "network_mapping")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("give at least one, or leave the field out")
            if len(set(value)) != len(value):
                raise ValueError(f"{value} names one twice")
        return value

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: list[list[str]] | None) -> list[list[str]] | None:
        if value is not None:
            if not value:
                raise ValueError("give at least one group of VMs, such as [[vm1], [vm1, vm2]]")
            for group in value:
                if not group:
                    raise ValueError("a group is empty")
                if len(set(group)) != len(group):
                    raise ValueError(f"group {group} names a VM twice")
        return value

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            groups = re.compile(value).groups
        except re.error as e:
            raise ValueError(f"{value!r} is not a valid regular expression: {e}") from None
        if groups != 1:
            raise ValueError(f"{value!r} has {groups} groups; give exactly one, around the number")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BenchmarkRun:
        if self.kind in ("command", "mlperf_log") and self.command is None:
            raise ValueError(f"kind {self.kind} needs `command`: the program line to run")
        if self.kind == "command" and self.pattern is None:
            raise ValueError("kind command needs `pattern`: a regular expression with one group")
        if self.kind != "command" and self.pattern is not None:
            raise ValueError(f"`pattern` is read only with kind command (kind {self.kind} has its own parser)")
        if self.launch in ("horovodrun", *SLURM_LAUNCHES, "none") and self.mpirun_args:
            raise ValueError("`mpirun_args` is read only with launch: mpirun or torchrun (which mpirun starts per node)")
        if self.launch != "torchrun" and self.torchrun_args:
            raise ValueError("`torchrun_args` is read only with launch: torchrun")
        if not self.through_slurm and self.srun_args:
            raise ValueError("`srun_args` is read only with launch: srun or sbatch")
        if self.kind != "pytorch_train":
            if self.precision == "bf16":
                raise ValueError(f"precision bf16 is read only with kind pytorch_train (kind {self.kind}: fp32 or fp16)")
            for flag in ("channels_last", "compile"):
                if getattr(self, flag):
                    raise ValueError(f"`{flag}` is read only with kind pytorch_train")
        if self.kind == "storage":
            if self.data == "synthetic":
                raise ValueError("kind storage reads files: give `data`, the directory fio reads in on the guests "
                                 "(the dataset's mount)")
            if self.launch != "none":
                raise ValueError("kind storage runs fio once per guest: launch none (leave `launch` out); "
                                 "scenario concurrent reads from several guests at once")
            if self.steps is not None:
                raise ValueError("kind storage runs for a time, not steps: give fio's --runtime=SECONDS in `args`")
        for flag in ("dataset", "compare_synthetic"):
            if getattr(self, flag) and (self.kind != "pytorch_train" or self.data == "synthetic"):
                raise ValueError(f"`{flag}` is read only with kind pytorch_train and a `data` directory")
        if self.framework is not None and self.kind != "horovod_synthetic":
            raise ValueError("`framework` is read only with kind horovod_synthetic")
        if self.scenario == "scaling":
            if self.groups is not None:
                raise ValueError("`groups` is for scenario concurrent; scaling runs take `nodes`")
        else:  # groups left out: one group of every guest (of the setup, in a campaign with setups)
            if self.nodes is not None:
                raise ValueError("`nodes` is for scenario scaling; concurrent runs take `groups`")
            if self.scaling is not None:
                raise ValueError("`scaling` (weak/strong) is for scenario scaling")
        return self

    @property
    def through_slurm(self) -> bool:
        return self.launch in SLURM_LAUNCHES

    @property
    def node_counts(self) -> list[int]:
        return list(self.nodes or [1])

    @property
    def scaling_mode(self) -> Literal["weak", "strong"] | None:
        return None if self.scenario == "concurrent" else (self.scaling or "weak")

    @property
    def variant(self) -> str:
        """`kind`, or `kind/framework` for Horovod's synthetic benchmarks."""
        if self.kind == "horovod_synthetic":
            return f"{self.kind}/{self.framework or 'tensorflow'}"
        return self.kind

    def per_gpu_batch(self, gpus: int) -> int:
        """The per-GPU batch at a point of `gpus` GPUs (strong scaling splits the global batch)."""
        if self.scaling_mode == "strong":
            return self.batch_size // gpus
        return self.batch_size


class Setup(Strict):
    """One VM/GPU layout of the campaign: the runbook's VMs that take part, each by name with the
    fields that differ (`{name: vm1, gpus: {mode: passthrough, count: 1}}`), and guest fields that
    differ (`{vm: vm1, slots: 1}`). Checked and built into a runbook of its own by runbook/setups.py."""

    name: str  # names the setup in plans, results.json and reports (--setup NAME)
    vms: list[dict[str, Any]] = Field(min_length=1)  # the VMs taking part: name and the fields that differ
    guests: list[dict[str, Any]] = []  # their guests' fields that differ: vm and the fields

    _n = field_validator("name")(lambda cls, v: checked_name(v))

    @field_validator("vms")
    @classmethod
    def _vms(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for entry in value:
            if not isinstance(entry.get("name"), str):
                raise ValueError("each entry names a VM of the runbook's `vms`: {name: vm1, ...}")
        return value

    @field_validator("guests")
    @classmethod
    def _guests(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for entry in value:
            if not isinstance(entry.get("vm"), str):
                raise ValueError("each entry names its VM: {vm: vm1, slots: 1}")
        return value


class BenchmarkSpec(Strict):
    """The whole `benchmarks` section."""

    launcher: str | None = None  # guest VM name; default the first guest
    container: bool = False  # run mpirun inside guests.image
    workdir: str = ".gpuvm-bench"  # on each guest; relative to the login directory
    docker_args: list[str] = []  # extra `docker run` words (container: true)
    runs: list[BenchmarkRun] = Field(min_length=1)  # the benchmarks, measured in this order
    setups: list[Setup] = []  # VM/GPU layouts applied in turn, each run in those it names

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        if not value.strip() or "\n" in value or value.startswith("~"):
            raise ValueError("give a directory path (absolute, or relative to the login directory; no '~')")
        return value

    def run(self, name: str) -> BenchmarkRun | None:
        return next((r for r in self.runs if r.name == name), None)


# ----------------------------------------------------------------------------- runbook checks


def guests_in_order(runbook: Runbook, launcher: str | None) -> list[Guest]:
    """The guests a scaling run takes: the launcher first, then the others in runbook order."""
    guests = list(runbook.guests.hosts) if runbook.guests else []
    first = next((g for g in guests if g.vm == launcher), None)
    if first is None:
        return guests
    return [first] + [g for g in guests if g is not first]


def check_benchmarks(runbook: Runbook, local: bool = False) -> BenchmarkSpec:
    """Everything about `benchmarks` that needs the rest of the runbook; InputError at file:line."""
    spec: BenchmarkSpec | None = runbook.benchmarks
    if spec is None:
        raise runbook.error(("benchmarks",), "the runbook has no `benchmarks` section (see docs/benchmarks.md)")
    guests = {g.vm: g for g in (runbook.guests.hosts if runbook.guests else [])}
    seen: dict[str, int] = {}
    for i, run in enumerate(spec.runs):
        if run.name in seen:
            raise runbook.error(("benchmarks", "runs", i, "name"),
                                f"benchmark '{run.name}' is declared twice (also runs[{seen[run.name]}])")
        seen[run.name] = i
        for source in run.upload:
            try:
                check_capped(upload_source(runbook, source), UPLOAD_BYTES, "upload")
            except InputError as e:
                raise runbook.error(("benchmarks", "runs", i, "upload", source), str(e)) from None
    _check_datasets(runbook, spec)
    _check_setup_names(runbook, spec)
    if local:
        _check_local(runbook, spec)
        return spec
    if spec.setups:
        return spec  # each setup is checked as a runbook of its own (load_runbook: setups.setup_runbooks)
    if not guests:
        raise runbook.error(("benchmarks",), "benchmarks run on guests: add guests.hosts (or pass --local)")
    if spec.launcher is not None and spec.launcher not in guests:
        raise runbook.error(("benchmarks", "launcher"),
                            f"'{spec.launcher}' is not a guest (guests: {listed(guests)})")
    if spec.container and (runbook.guests is None or runbook.guests.image is None):
        raise runbook.error(("benchmarks", "container"), "container: true needs guests.image (the training image)")
    ordered = guests_in_order(runbook, spec.launcher)
    mesh = runbook.guests.ssh_mesh if runbook.guests else None
    if spec.container and not (mesh and mesh.container_port) and any(
            max(run.node_counts) > 1 for run in spec.runs if run.scenario == "scaling"):
        raise runbook.error(("benchmarks", "container"),
                            "containers across guests reach each other's sshd: set guests.ssh_mesh.container_port "
                            "(the port, and the known_hosts entries the mesh writes for it)")
    for i, run in enumerate(spec.runs):
        loc = ("benchmarks", "runs", i)
        if run.through_slurm and spec.container:
            raise runbook.error(loc + ("launch",), f"launch: {run.launch} starts the ranks on the guests themselves, not in "
                                "guests.image: set container: false, or launch: mpirun")
        if run.network_mapping and not any(g.rdma_ports for g in guests.values()):
            raise runbook.error(loc + ("network_mapping",), "the mapping is derived from the guests' rdma_ports, "
                                "and no guest has any (see guests.hosts[].rdma_ports)")
        if run.scenario == "scaling":
            for j, count in enumerate(run.node_counts):
                if count > len(ordered):
                    raise runbook.error(loc + ("nodes", j),
                                        f"{count} nodes, but the runbook has {len(ordered)} guest(s)")
                _check_batch(runbook, run, loc, count, gpus_per_vm(run, ordered[:count], runbook, loc))
        else:
            for j, group in enumerate(concurrent_groups(runbook, run)):
                for vm in group:
                    if vm not in guests:
                        raise runbook.error(loc + ("groups", j),
                                            f"'{vm}' is not a guest (guests: {listed(guests)})")
                _check_batch(runbook, run, loc, 1, gpus_per_vm(run, [guests[vm] for vm in group], runbook, loc))
    return spec


def _check_datasets(runbook: Runbook, spec: BenchmarkSpec) -> None:
    """Runs that ask for a dataset at the same path ask for the same one."""
    first: dict[str, int] = {}
    for i, run in enumerate(spec.runs):
        if run.dataset is None:
            continue
        j = first.setdefault(run.data, i)
        if spec.runs[j].dataset != run.dataset:
            raise runbook.error(("benchmarks", "runs", i, "dataset"),
                                f"runs[{j}] asks for another dataset at {shown(run.data)}; give them the same "
                                "files and file_kb, or another path")


def _check_setup_names(runbook: Runbook, spec: BenchmarkSpec) -> None:
    names: dict[str, int] = {}
    for i, setup in enumerate(spec.setups):
        if setup.name in names:
            raise runbook.error(("benchmarks", "setups", i, "name"),
                                f"setup '{setup.name}' is declared twice (also setups[{names[setup.name]}])")
        names[setup.name] = i
    for i, run in enumerate(spec.runs):
        for j, name in enumerate(run.setups or []):
            if name not in names:
                known = listed(names) or "none: add benchmarks.setups"
                raise runbook.error(("benchmarks", "runs", i, "setups", j), f"no setup '{name}' (setups: {known})")


def concurrent_groups(runbook: Runbook, run: BenchmarkRun) -> list[list[str]]:
    """A concurrent run's groups of VMs; left out, one group of every guest."""
    if run.groups is not None:
        return run.groups
    return [[g.vm for g in runbook.guests.hosts]] if runbook.guests and runbook.guests.hosts else []


def _check_local(runbook: Runbook, spec: BenchmarkSpec) -> None:
    for i, run in enumerate(spec.runs):
        loc = ("benchmarks", "runs", i)
        if run.scenario == "concurrent":
            raise runbook.error(loc + ("scenario",),
                                "concurrent runs need guests; --local runs scaling benchmarks on this machine")
        if run.through_slurm:
            raise runbook.error(loc + ("launch",), f"launch: {run.launch} submits to the guests' Slurm; --local has none")
        for count in run.node_counts:
            _check_batch(runbook, run, loc, count, run.gpus_per_vm or 1)


def _check_batch(runbook: Runbook, run: BenchmarkRun, loc: tuple, nodes: int, per_vm: int) -> None:
    gpus = nodes * per_vm
    if run.launch == "none" and gpus > 1:
        raise runbook.error(loc + ("launch",),
                            f"launch: none starts one process, but {nodes} node(s) x {per_vm} GPU(s) need {gpus}; "
                            "use mpirun or torchrun")
    if run.scaling_mode == "strong" and run.batch_size % gpus:
        raise runbook.error(loc + ("batch_size",),
                            f"strong scaling splits the global batch {run.batch_size} over {gpus} GPU(s) "
                            f"at {nodes} node(s); it must divide evenly")


def gpus_per_vm(run: BenchmarkRun, guests: list[Guest], runbook: Runbook, loc: tuple) -> int:
    """GPUs (MPI ranks) per VM: the run's `gpus_per_vm`, else the guests' slots (`Runbook.slots_of`:
    given, or their VM's GPU count; they must agree);
    one for kind storage (one fio per guest)."""
    if run.kind == "storage":
        return 1
    if run.gpus_per_vm is not None:
        return run.gpus_per_vm
    slots = {runbook.slots_of(g) for g in guests}
    if len(slots) > 1:
        names = listed(f"{g.vm}={runbook.slots_of(g)}" for g in guests)
        raise runbook.error(loc, f"the guests have different slots ({names}); set gpus_per_vm")
    return slots.pop() if slots else 1


def upload_source(runbook: Runbook, source: str) -> Path:
    path = Path(source).expanduser()
    return path if path.is_absolute() else runbook.file.parent / path
