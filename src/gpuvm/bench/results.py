"""The results of a benchmark run, as typed models and as files on disk.

A results directory holds `results.json` (format `gpuvm-results/2`; /1, without `environment` per
repeat, is still read) and `logs/` with the raw
output of every repeat. A baseline may also be a short YAML file:

    environment: bare-metal
    benchmarks:
      resnet50-scaling: {1: 2790, 2: 5470, 4: 10818}   # nodes: value (one repeat each)

The models forbid unknown fields, so nothing but figures and inventory (never credentials) can be
written or read.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuvm.errors import InputError
from gpuvm.runbook.benchmarks import Dataset, Launch
from gpuvm.files import RESULTS_BYTES, read_text_capped
from gpuvm.runbook.document import MAX_NODES, Locator, TooLarge, expanded_size, field_path
from gpuvm.secrets import scrub

FORMAT = "gpuvm-results/2"
FORMATS = ("gpuvm-results/1", FORMAT)  # what is read: /2 added the environment of each repeat
MAX_NAME = 200  # characters of a benchmark's, a setup's or a unit's name (a runbook allows 80)
MAX_DEPTH = 64  # a results document nests 6 levels; a deeper one is not one
MAX_FIGURE = 1e15  # larger figures are garbage (and their sums overflow to Infinity)
RESULTS_FILE = "results.json"
LOGS_DIR = "logs"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunbookRef(_Model):
    path: str
    sha256: str


class VmInfo(_Model):
    name: str
    host: str
    gpus: int = Field(ge=0)
    cpus: int = Field(ge=1)
    memory_gb: float = Field(gt=0)


class GpuState(_Model):
    """One GPU as `nvidia-smi -q` saw it right after a repeat (fields the driver did not report: absent)."""

    bus_id: str = Field(max_length=MAX_NAME)
    performance_state: str | None = Field(default=None, max_length=MAX_NAME)
    clocks_mhz: dict[str, float] = Field(default_factory=dict)  # now: graphics, sm, memory, video
    applications_clocks_mhz: dict[str, float] = Field(default_factory=dict)  # what the clocks are set to
    max_clocks_mhz: dict[str, float] = Field(default_factory=dict)
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: list[str] = Field(default_factory=list)  # active clock throttle (event) reasons


class Environment(_Model):
    """What one machine ran a repeat with (gpuvm.bench.environment): each part where present."""

    driver: str | None = Field(default=None, max_length=MAX_NAME)
    cuda: str | None = Field(default=None, max_length=MAX_NAME)
    frameworks: dict[str, str] = Field(default_factory=dict)  # torch, tensorflow, horovod, jax: version
    governor: str | None = Field(default=None, max_length=MAX_NAME)  # CPU frequency governor(s), "performance"
    load: list[float] | None = None  # load average over 1, 5 and 15 minutes
    gpus: list[GpuState] = Field(default_factory=list)


class Repeat(_Model):
    """One run of one point. For concurrent points `value` is the total over `per_vm`.

    A failed run (non-zero exit, timeout, no figure in its log) has no `value` and says why in
    `error`; comparisons read only the runs that succeeded. `metrics`: other figures of the run
    (storage: read_iops, lat_mean_ms, clat_p99_ms, ...; concurrent points: `<vm>/<name>`).
    """

    value: float | None = None
    per_vm: dict[str, float] | None = None
    metrics: dict[str, float] | None = None
    log: str | None = None
    error: str | None = None
    environment: dict[str, Environment] | None = None  # by machine (guest VM, or the local host name)
    slurm_jobs: list[int] | None = None  # launch srun: the Slurm job id of each job the run was

    @model_validator(mode="before")
    @classmethod
    def _invalid_figure_is_an_error(cls, data: Any) -> Any:
        """A figure that is not a finite number of sane size (NaN, Infinity, 1e308: a benchmark
        printed it, or a file was edited) makes the run a failure that says so, not a number that
        poisons every median and sum; metrics that are not are left out."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("metrics"), dict):
            data["metrics"] = {k: v for k, v in data["metrics"].items() if not _is_number(v) or valid_figure(v)}
        bad = [v for v in [data.get("value"), *(data.get("per_vm") or {}).values()]
               if _is_number(v) and not valid_figure(v)]
        if bad and data.get("error") is None:
            data.update(value=None, per_vm=None, error=f"invalid figure {bad[0]!r} (expected a finite number "
                                                       f"of magnitude at most {MAX_FIGURE:g})")
        elif bad:
            data.update(value=None, per_vm=None)
        return data

    @model_validator(mode="after")
    def _value_or_error(self) -> Repeat:
        if (self.value is None) == (self.error is None):
            raise ValueError("a repeat has either a value or an error")
        return self

    @property
    def ok(self) -> bool:
        return self.value is not None


class Point(_Model):
    """One configuration: `nodes` hosts, `gpus_per_node` GPUs used on each, `vms` VMs in all; in a
    campaign with setups, the `setup` it ran in; `network_mapping` on/off when the run measured both,
    and `network` the settings gpuvm derived for it (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, btl_tcp_if_include);
    `data` files/synthetic when the run measured both (compare_synthetic); `warmups` the warm-up runs
    before the repeats (excluded from every figure, recorded so a reader sees what was left out)."""

    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(default=1, ge=1)
    vms: int = Field(default=1, ge=1)
    setup: str | None = Field(default=None, max_length=MAX_NAME)
    network_mapping: Literal["on", "off"] | None = None
    network: dict[str, str] = Field(default_factory=dict)
    data: Literal["files", "synthetic"] | None = None
    repeats: list[Repeat] = Field(min_length=1)
    warmups: list[Repeat] = Field(default_factory=list)  # whole warm-up runs: kept for the record, never compared

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class Benchmark(_Model):
    name: str = Field(min_length=1, max_length=MAX_NAME)
    kind: str = Field(max_length=MAX_NAME)
    unit: str = Field(default="", max_length=MAX_NAME)
    higher_is_better: bool = True
    scenario: Literal["concurrent", "scaling"] = "scaling"
    scaling: Literal["weak", "strong"] | None = None
    launch: Launch | None = None  # the launcher; None in baselines and older results
    dataset: Dataset | None = None  # the files it read, as gpuvm wrote them (their size: `size --results`)
    points: list[Point] = Field(min_length=1)

    @model_validator(mode="after")
    def _points_are_distinct(self) -> Benchmark:
        keys = [point_key(self, p) for p in self.points]
        duplicates = sorted({tuple(v for v in k if v != "") for k in keys if keys.count(k) > 1}, key=str)
        if duplicates:
            raise ValueError(
                f"points repeat the same configuration {duplicates}; put runs in `repeats`"
            )
        return self


class SetupInfo(_Model):
    """A setup of the campaign: the ESXi hosts and VMs (as laid out for it) that took part."""

    name: str
    hosts: list[str] = Field(default_factory=list)
    vms: list[VmInfo] = Field(default_factory=list)


class Results(_Model):
    format: Literal["gpuvm-results/1", "gpuvm-results/2"] = FORMAT
    environment: Literal["vm", "bare-metal"]
    note: str | None = Field(default=None, max_length=10_000)
    runbook: RunbookRef | None = None
    started: datetime | None = None
    finished: datetime | None = None
    hosts: list[str] = Field(default_factory=list)
    vms: list[VmInfo] = Field(default_factory=list)
    setups: list[SetupInfo] = Field(default_factory=list)  # campaigns with setups: each one's VMs
    software: dict[str, dict[str, str]] = Field(default_factory=dict)
    benchmarks: list[Benchmark] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_are_distinct(self) -> Results:
        names = [b.name for b in self.benchmarks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"benchmark names repeat: {', '.join(duplicates)}")
        return self

    def benchmark(self, name: str) -> Benchmark | None:
        return next((b for b in self.benchmarks if b.name == name), None)


def point_key(benchmark: Benchmark, point: Point) -> tuple[str | int, ...]:
    """What identifies a point: its setup, network mapping and data, then the node count when
    scaling; nodes, GPUs and VMs when concurrent."""
    tags = (point.setup or "", point.network_mapping or "", point.data or "")
    if benchmark.scenario == "scaling":
        return (*tags, point.nodes)
    return (*tags, point.nodes, point.gpus_per_node, point.vms)


# ---------------------------------------------------------------------------------------- saving


def save_results(directory: Path | str, results: Results) -> Path:
    """Write `results.json` into `directory` (created, with `logs/`); return its path."""
    from gpuvm.files import writing

    directory = Path(directory)
    path = directory / RESULTS_FILE
    text = json.dumps(scrub(results.model_dump(mode="json")), indent=2) + "\n"  # secrets masked, then encoded
    tmp = path.with_suffix(".json.tmp")
    with writing(path, "results"):
        (directory / LOGS_DIR).mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path


# --------------------------------------------------------------------------------------- loading


def load_results(path: Path | str) -> Results:
    """Read a results directory, a results JSON file, or a YAML (short or full) baseline."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
        if not path.is_file():
            raise InputError(
                f"{path.parent}: no {RESULTS_FILE} (expected a results directory or a results file)"
            )
    elif not path.is_file():
        raise InputError(f"{path}: no such file or directory (expected results or a baseline)")
    text = read_text_capped(path, RESULTS_BYTES, "results")
    if path.suffix.lower() in (".yaml", ".yml"):
        return _load_yaml(path, text)
    return _load_json(path, text)


def _load_json(path: Path, text: str) -> Results:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply (not a results file)") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object with format {FORMAT!r}")
    if data.get("format") not in FORMATS:
        raise InputError(f"{path}: format is {data.get('format')!r} (expected {FORMAT!r})")
    return _validate(path, data, source=None)


def _load_yaml(path: Path, text: str) -> Results:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    if _nesting(text) > MAX_DEPTH:  # checked first: ruamel takes seconds to fail on a deep document
        raise InputError(f"{path}: nested too deeply (more than {MAX_DEPTH} levels; not a baseline)")
    try:
        data = YAML(typ="rt").load(text)
        # the runbook loader's limits: an alias bomb expands to billions of values, a value may hold itself
        if expanded_size(data, {}) > MAX_NODES:
            raise InputError(f"{path}: the document expands to more than {MAX_NODES:,} values (YAML aliases?)")
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    except TooLarge as e:
        raise InputError(f"{path}: {e}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply (not a baseline)") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping with `environment` and `benchmarks`")
    source = data
    benchmarks = data.get("benchmarks")
    if isinstance(benchmarks, dict):
        data = dict(data)
        data["benchmarks"] = [
            _short_benchmark(path, benchmarks, name, spec) for name, spec in benchmarks.items()
        ]
    data = dict(data)
    data.setdefault("format", FORMAT)
    return _validate(path, _plain(data), source=source)


def _nesting(text: str) -> int:
    """How deeply the YAML document nests (as far as libyaml read it before any refusal, which
    ruamel then words), read from libyaml's events: no recursion, no values built."""
    try:
        import yaml

        events = yaml.parse(text, Loader=yaml.CSafeLoader)
    except (ImportError, AttributeError):
        return 0
    depth = deepest = 0
    try:
        for event in events:
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                deepest = max(deepest, depth)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as e:
        if "nesting depth" in str(e):  # libyaml's own limit (1,000 levels), met before ours in flow style
            return MAX_DEPTH + 1
    return deepest


def _short_benchmark(path: Path, parent: Any, name: Any, spec: Any) -> dict:
    """`name: {nodes: value | [values]}` (or with `points:` and settings) → a full benchmark."""
    where = _line(path, parent, name)
    settings: dict = {}
    points = spec
    if isinstance(spec, dict) and "points" in spec:
        settings = {k: v for k, v in spec.items() if k != "points"}
        points = spec["points"]
        where = _line(path, spec, "points")
    if not isinstance(points, dict) or not points:
        raise InputError(
            f"{where}: benchmarks.{name}: expected a mapping of node count to value, "
            "such as {1: 2790, 2: 5470}"
        )
    full_points = []
    for nodes, values in points.items():
        at = _line(path, points, nodes)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise InputError(
                f"{at}: benchmarks.{name}: node count {nodes!r} is not a positive integer"
            )
        values = values if isinstance(values, list) else [values]
        if not values or not all(_is_number(v) for v in values):
            raise InputError(
                f"{at}: benchmarks.{name}.{nodes}: expected a number or a list of numbers, "
                f"got {_plain(values)!r}"
            )
        full_points.append({"nodes": nodes, "repeats": [{"value": float(v)} for v in values]})
    return {"name": str(name), "kind": "baseline", **settings, "points": full_points}


def _validate(path: Path, data: dict, source: Any) -> Results:
    try:
        return Results.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = tuple(first["loc"])
        where = Locator.of(path, source).where(loc) if source is not None else f"{path}: {field_path(loc)}"
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise InputError(f"{where}: {first['msg']}{more}") from None


def _line(path: Path, mapping: Any, key: Any) -> str:
    """`path:line` of `key` in a ruamel mapping, or just `path` when unknown."""
    try:
        return f"{path}:{mapping.lc.key(key)[0] + 1}"
    except (AttributeError, KeyError, TypeError):
        return str(path)


def valid_figure(value: float) -> bool:
    """A figure gpuvm can compute with: finite and at most MAX_FIGURE in magnitude."""
    return math.isfinite(value) and abs(value) <= MAX_FIGURE


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    """ruamel's commented containers and scalars → plain Python, for pydantic."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


# --------------------------------------------------------------------------------------- merging


def merge_results(sets: list[tuple[str, Results]]) -> Results:
    """Several results (each named by where it was read) as one, to compare setups side by side.

    Points keep their setup; with more than one set, a point without one (a campaign without
    setups) takes its set's name. Benchmarks of one name are merged; a point measured in two sets
    is refused, as are sets of different environments (VMs and bare metal)."""
    if len(sets) == 1:
        return sets[0][1]
    environments = {results.environment for _, results in sets}
    if len(environments) > 1:
        names = ", ".join(f"{name} ({results.environment})" for name, results in sets)
        raise InputError(f"results to merge mix environments: {names}; give bare metal as --baseline")
    benchmarks: dict[str, dict] = {}
    origin: dict[tuple, str] = {}
    for name, results in sets:
        for bench in results.benchmarks:
            merged = benchmarks.setdefault(bench.name, {**bench.model_dump(exclude={"points"}), "points": []})
            if (merged["kind"], merged["unit"]) != (bench.kind, bench.unit):
                raise InputError(f"{name}: benchmark {bench.name} is {bench.kind} in {bench.unit or 'no unit'}, "
                                 f"but {merged['kind']} in {merged['unit'] or 'no unit'} elsewhere")
            for point in bench.points:
                point = point if point.setup else point.model_copy(update={"setup": name})
                key = (bench.name, *point_key(bench, point))
                if key in origin:
                    raise InputError(f"{name} and {origin[key]} both measured {bench.name} at the same point "
                                     f"(setup {point.setup}); compare them one at a time")
                origin[key] = name
                merged["points"].append(point)
    notes = [f"{name}: {results.note}" for name, results in sets if results.note]
    return Results(
        environment=sets[0][1].environment,
        note="; ".join(notes) or None,
        hosts=list(dict.fromkeys(h for _, results in sets for h in results.hosts)),
        setups=[s for _, results in sets for s in results.setups],
        software={k: v for _, results in sets for k, v in results.software.items()},
        benchmarks=[Benchmark.model_validate(b) for b in benchmarks.values()],
    )
