"""Sweeps: the cross product of named parameters over a base scenario, each point run once.

A sweep spec (YAML):

    name: rate-by-stack
    base: scenario.yaml          # a scenario file, or an inline mapping; omitted: the baseline scenario
    seeds: [0, 1, 2]
    drop_fraction: 0.1           # steady-state window: this fraction of arrivals dropped at each end
    baseline_capacity_rps: 15.7  # optional: adds rho = rate / this to every row, and allows `rho` as a parameter
    params:                      # the cross product of these, in this order (each × every seed)
      stack: [vllm+round_robin, vllm_priority+round_robin]
      rate: [8, 12, 16]
      replicas: [2, 4]
      cluster.local_policy_params.some_knob: [1, 2]   # any dotted path into the scenario

Named parameters: stack (LOCAL+CLUSTER), rate (req/s; the workload's mean rate), rho (× baseline_capacity_rps),
replicas, model, gpu, tp, K (tiers), budget (token budget), max_num_seqs, num_requests. A finished point is
kept as `points/<id>.json` (id: a hash of the point's full config and seed), so a sweep run again in the same
folder runs only the missing points; `results.parquet` (or .csv) holds one row per point with its full config.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierserve.core import ConfigError
from tierserve.core.outputs import MANIFEST_JSON
from tierserve.experiments.runs import run_many


# ---- sweeps from a spec: the cross product of named parameters over a base scenario ------------------------
PARAM_PATHS: dict[str, str] = {
    "replicas": "cluster.num_replicas", "model": "cluster.replica.model", "gpu": "cluster.replica.gpu",
    "tp": "cluster.replica.tp", "K": "workload.tiers.num_tiers", "budget": "cluster.replica.token_budget",
    "max_num_seqs": "cluster.replica.max_num_seqs", "num_requests": "workload.num_requests",
}
SPECIAL_PARAMS = ("stack", "rate", "rho")
POINTS_DIR = "points"
RESULTS_STEM = "results"
SWEEP_JSON = "sweep.json"
ROW_METRICS = ("slo_attainment", "attainment_goal", "ttft.p50", "ttft.p99", "tbt.p99", "ttlt.p99", "goodput_rps",
               "throughput_rps")


def _spec_model():
    from pydantic import BaseModel, ConfigDict, Field

    from tierserve.core.limits import Int

    class SweepSpec(BaseModel):
        """A validated sweep spec (see the section's docstring)."""

        model_config = ConfigDict(extra="forbid")
        name: str = Field("sweep", max_length=200)
        base: str | dict[str, Any] | None = None
        seeds: list[Int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, max_length=1000)
        drop_fraction: float = Field(0.1, ge=0, lt=0.5)
        baseline_capacity_rps: float | None = Field(None, gt=0, allow_inf_nan=False)
        params: dict[str, list[Any]] = Field(min_length=1)

    return SweepSpec


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of a sweep: its parameter values, seed, and the full scenario it runs."""

    params: dict[str, Any]
    seed: int
    config: dict[str, Any]                  # ScenarioConfig as JSON, the seed set
    drop_fraction: float

    @property
    def id(self) -> str:
        import hashlib
        import json
        key = json.dumps({"config": self.config, "drop_fraction": self.drop_fraction}, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class Sweep:
    name: str
    points: list[SweepPoint]
    param_names: list[str]
    baseline_capacity_rps: float | None = None
    spec: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Sweep:
        from tierserve.core.files import read_mapping
        data = read_mapping(path, "sweep spec", "yaml")
        base = data.get("base")
        if isinstance(base, str):                     # relative to the spec's folder
            p = Path(base)
            data = {**data, "base": str(p if p.is_absolute() else Path(path).parent / p)}
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sweep:
        import itertools

        from pydantic import ValidationError

        from tierserve.core.errors import config_error_from_validation
        from tierserve.experiments.scenario import ScenarioConfig, baseline_scenario
        try:
            spec = _spec_model().model_validate(data)
        except ValidationError as e:
            raise config_error_from_validation(e, "sweep") from None
        if isinstance(spec.base, str):
            base = ScenarioConfig.from_yaml(spec.base)
        elif isinstance(spec.base, dict):
            base = ScenarioConfig.from_dict(spec.base)
        else:
            base = baseline_scenario()
        for name, values in spec.params.items():
            if not values:
                raise ConfigError(f"params.{name}", values, "a non-empty list of values")
            if name == "rho" and spec.baseline_capacity_rps is None:
                raise ConfigError("params.rho", values, "only with baseline_capacity_rps set (rho = rate / it)")
            if name not in SPECIAL_PARAMS and name not in PARAM_PATHS and "." not in name:
                raise ConfigError(f"params.{name}", values, f"a named parameter ({', '.join(SPECIAL_PARAMS + tuple(PARAM_PATHS))}) "
                                  "or a dotted path into the scenario, e.g. cluster.replica.tp")
        names = list(spec.params)
        base_json = base.model_dump(mode="json")
        points = []
        for combo in itertools.product(*(spec.params[n] for n in names)):
            values = dict(zip(names, combo))
            cfg = apply_params(base_json, values, spec.baseline_capacity_rps)
            for seed in spec.seeds:
                points.append(SweepPoint(values, int(seed), {**cfg, "seed": int(seed)}, spec.drop_fraction))
        return cls(spec.name, points, names, spec.baseline_capacity_rps, spec.model_dump(mode="json"))


def _set_path(data: dict[str, Any], path: str, value: Any, field_name: str) -> None:
    keys = path.split(".")
    node = data
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            raise ConfigError(f"params.{field_name}", path, f"a path into the scenario ({k!r} is not a section)")
        node = node[k]
    node[keys[-1]] = value


def apply_params(base: dict[str, Any], values: dict[str, Any], baseline_capacity_rps: float | None = None
                 ) -> dict[str, Any]:
    """The scenario (as JSON) with a point's parameter values applied, validated (errors name the parameter)."""
    import copy

    from tierserve.experiments.capacity import with_rate
    from tierserve.experiments.scenario import ScenarioConfig
    data = copy.deepcopy(base)
    rate = None
    for name, value in values.items():
        if name == "stack":
            local, _, glob = str(value).partition("+")
            if not local or not glob:
                raise ConfigError("params.stack", value, "LOCAL+CLUSTER, e.g. vllm+round_robin")
            data["cluster"]["local_policy"], data["cluster"]["cluster_policy"] = local, glob
        elif name in ("rate", "rho"):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"params.{name}", value, "a positive number")
            rate = float(value) * (baseline_capacity_rps if name == "rho" else 1.0)
        else:
            _set_path(data, PARAM_PATHS.get(name, name), value, name)
    cfg = ScenarioConfig.from_dict(data)
    if rate is not None:
        cfg = with_rate(cfg, rate)
    return cfg.model_dump(mode="json")


def run_point(config: dict[str, Any], drop_fraction: float) -> dict[str, Any]:
    """Worker: one sweep point simulated and judged in steady state; its metrics per tier as a flat mapping."""
    from tierserve.experiments.capacity import rate_of, run_seed_job
    from tierserve.experiments.scenario import ScenarioConfig
    run = run_seed_job(config, int(config["seed"]), drop_fraction)
    out: dict[str, Any] = {"rate": rate_of(ScenarioConfig.from_dict(config)), "verdict": run.verdict_line(),
                           "stable": run.stable}
    for tier, s in run.summary.tiers.items():
        out[f"{tier}.n"] = s.total
        for m in ROW_METRICS:
            out[f"{tier}.{m}"] = s.get(m)
        if tier in run.stability:
            out[f"{tier}.stable"] = run.stability[tier].stable
    return out


@dataclass
class SweepRun:
    """What `run_sweep` did: the table's rows, how many points ran now and how many were already done."""

    rows: list[dict[str, Any]]
    ran: int
    reused: int
    table_path: Path | None
    wall_s: float
    cpu_s: float                      # CPU time of this process and its (finished) workers during the run


def _point_path(outdir: Path, point: SweepPoint) -> Path:
    return outdir / POINTS_DIR / f"{point.id}.json"


def _read_point(path: Path, point: SweepPoint) -> dict[str, Any] | None:
    """The metrics of `point` kept at `path`, or None when there is no such file or it is not this point's
    (unreadable, another point's id, another config): such a point is run again and its file replaced."""
    import json
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not (isinstance(doc, dict) and doc.get("id") == point.id and doc.get("config") == point.config
            and isinstance(doc.get("metrics"), dict)):
        return None
    return doc["metrics"]


def finished_points(sweep: Sweep, outdir: str | Path) -> set[str]:
    """Ids of the sweep's points whose result files are already in `outdir` (and are theirs)."""
    return {p.id for p in sweep.points if _read_point(_point_path(Path(outdir), p), p) is not None}


def _row(point: SweepPoint, metrics: dict[str, Any], baseline_capacity_rps: float | None) -> dict[str, Any]:
    import json
    row: dict[str, Any] = {"point_id": point.id, **{f"param.{k}": v for k, v in point.params.items()},
                           "seed": point.seed, **metrics}
    if baseline_capacity_rps:
        row["rho"] = metrics["rate"] / baseline_capacity_rps
    row["config"] = json.dumps(point.config, sort_keys=True)
    return row


def run_sweep(sweep: Sweep, outdir: str | Path, executor: str = "process", workers: int | None = None,
              progress: bool = True, table_format: str = "parquet", address: str | None = None) -> SweepRun:
    """Run the sweep's missing points (finished ones are read back from `outdir/points/`), then write the table.

    Each point's file is written (atomically) by this process as the point ends, so a sweep that is killed —
    even by SIGKILL — keeps every point that had finished; run it again with the same folder to run only the
    rest. The folder is locked while the sweep runs (a second sweep on it is refused), its `manifest.json` is
    removed at the start and written last (every point, the table and `sweep.json` with their digests), so a
    folder without a manifest is not a finished sweep; a previous sweep's files this one does not list go."""
    import json

    from tierserve.core.outputs import FolderLock, check_out_dir, publish_in_place, read_manifest, write_text_atomic
    if table_format not in ("parquet", "csv"):
        raise ConfigError("--format", table_format, "parquet | csv")
    out = check_out_dir(outdir)
    with FolderLock(out):
        old = read_manifest(out)                     # a foreign manifest.json is refused before any work
        (out / MANIFEST_JSON).unlink(missing_ok=True)  # from here until the end the folder vouches for nothing
        (out / POINTS_DIR).mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        usage0 = _cpu_s()
        done = finished_points(sweep, out)
        todo = [p for p in sweep.points if p.id not in done]

        def keep(i: int, metrics: dict[str, Any]) -> None:
            p = todo[i]
            write_text_atomic(_point_path(out, p), json.dumps(
                {"id": p.id, "params": p.params, "seed": p.seed, "config": p.config, "metrics": metrics},
                allow_nan=True) + "\n")

        run_many(run_point, [{"config": p.config, "drop_fraction": p.drop_fraction} for p in todo],
                 executor=executor, workers=workers, progress=progress, description=f"sweep {sweep.name}",
                 on_result=keep, address=address)
        rows = []
        for p in sweep.points:
            metrics = _read_point(_point_path(out, p), p)
            if metrics is None:                      # removed or replaced by something else while we ran
                raise ConfigError("--out", str(_point_path(out, p)), "the point file this sweep just wrote (it "
                                                                    "is gone or no longer this point's)")
            rows.append(_row(p, metrics, sweep.baseline_capacity_rps))
        path = write_table(rows, out / f"{RESULTS_STEM}.{table_format}")
        write_text_atomic(out / SWEEP_JSON, json.dumps(
            {"name": sweep.name, "spec": sweep.spec, "params": sweep.param_names, "points": len(sweep.points),
             "table": path.name}, indent=2) + "\n")
        listed = sorted({str(_point_path(Path(), p)) for p in sweep.points}) + [path.name, SWEEP_JSON]
        publish_in_place(out, listed, old)
    return SweepRun(rows, len(todo), len(done), path, time.perf_counter() - t0, _cpu_s() - usage0)


def _cpu_s() -> float:
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def write_table(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Rows (mappings with the same keys, in order of first appearance) as Parquet (pyarrow) or CSV, atomically."""
    from tierserve.core.files import atomic_path
    p = Path(path)
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    with atomic_path(p) as tmp:
        if p.suffix == ".parquet":
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise ConfigError("--format", "parquet", "csv, or install pyarrow (pip install pyarrow)") from None
            pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]), tmp)
        else:
            import csv
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                w = csv.DictWriter(f, fieldnames=list(columns))
                w.writeheader()
                w.writerows(rows)
    return p


def read_table(path: str | Path) -> list[dict[str, Any]]:
    """A sweep table written by `write_table` (Parquet or CSV; CSV values come back as text)."""
    p = Path(path)
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq
        return pq.read_table(p).to_pylist()
    import csv
    with open(p, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
