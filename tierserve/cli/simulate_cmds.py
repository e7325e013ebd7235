"""`tierserve simulate`, `tierserve compare`, `tierserve policies`."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from tierserve.core import ConfigError
from tierserve.core.errors import Interrupted
from tierserve.cli.options import (DropFraction, Executor, Gpu, Model, NumRequests, OutFolder, Rate, Replicas,
                                   ScenarioFile, Seed, Seeds, SteadyState, Tp)
from tierserve.core.files import check_out_dir, shown
from tierserve.experiments.capacity import judge
from tierserve.experiments.scenario import (
    STREAM_ABOVE, ScenarioConfig, ScenarioResult, run_scenario, should_stream, write_result,
)
from tierserve.metrics.stability import (
    DEFAULT_DROP_FRACTION, UNSTABLE, Interval, SeedsResult, StabilityVerdict,
)

MAIN_JOB_METRICS = ("ttft.p50", "ttft.p99", "tbt.p99", "ttlt.p99", "slo_attainment", "goodput_rps")
# What `tierserve simulate` runs with no options: FCFS, tier priority, and the tier contract (docs/contract.md).
MAIN_JOB_STACKS = ("vllm+round_robin", "vllm_priority+round_robin", "tierserve+tierserve")


def scenario_from_options(config: Optional[Path], overrides: dict[str, Any]) -> ScenarioConfig:
    """A scenario file (or the default scenario) with command-line flags applied on top, then validated."""
    base = ScenarioConfig.from_yaml(config) if config else ScenarioConfig()
    data = base.model_dump(mode="json", exclude_unset=False)
    cl, rep, wl = data["cluster"], data["cluster"]["replica"], data["workload"]
    o = {k: v for k, v in overrides.items() if v is not None}
    if "trace_format" in o and "trace" not in o:
        raise ConfigError("--trace-format", o["trace_format"], "only together with --trace FILE (it says how to "
                                                               "read that file)")
    for key, target, field in (("model", rep, "model"), ("gpu", rep, "gpu"), ("tp", rep, "tp"),
                               ("replicas", cl, "num_replicas"), ("local_policy", cl, "local_policy"),
                               ("cluster_policy", cl, "cluster_policy"), ("num_requests", wl, "num_requests"),
                               ("time_limit", cl, "time_limit_s")):
        if key in o:
            target[field] = o[key]
    if "seed" in o:
        data["seed"] = o["seed"]
    if o.get("no_skip_ahead"):
        cl["skip_ahead"] = False
    if "trace" in o:
        wl["trace"] = {"path": str(o["trace"]), "format": o.get("trace_format") or "csv"}
        wl["arrivals"] = {"kind": "trace"} if "rate" not in o else {"kind": "poisson", "rate": o["rate"]}
        wl["lengths"] = {"kind": "trace"}
        if "num_requests" not in o:
            wl["num_requests"] = None
    elif "rate" in o:
        arrivals = wl["arrivals"]
        if arrivals.get("kind") in ("poisson", "gamma"):
            arrivals["rate"] = o["rate"]
        else:
            wl["arrivals"] = {"kind": "poisson", "rate": o["rate"]}
    return ScenarioConfig.from_dict(data)


def run_with_progress(cfg: ScenarioConfig, console: Console, stream: bool = False, out: Optional[Path] = None,
                      records: str = "csv") -> ScenarioResult:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed}/{task.total} requests"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("sim", total=cfg.workload.num_requests or 0)
        kw = dict(stream=True, outdir=out, records=records) if stream else {}
        return run_scenario(cfg, progress=lambda done, total: bar.update(task, completed=done, total=total), **kw)


def register(app: typer.Typer, console: Console) -> None:
    @app.command()
    def simulate(
        config: ScenarioFile = None,
        model: Model = None,
        gpu: Gpu = None,
        tp: Tp = None,
        replicas: Replicas = None,
        local_policy: Optional[str] = typer.Option(None, "--local-policy", "-l", help="Replica scheduler."),
        cluster_policy: Optional[str] = typer.Option(None, "--cluster-policy", "-g", help="Global scheduler."),
        trace: Optional[Path] = typer.Option(None, help="Replay a trace file instead of the synthetic workload."),
        trace_format: Optional[str] = typer.Option(None, help="csv | azure | mooncake | vidur | vidur_run."),
        rate: Rate = None,
        num_requests: NumRequests = None,
        seed: Seed = None,
        time_limit: Optional[float] = typer.Option(None, help="Stop at this simulated time (s); the rest is censored."),
        no_skip_ahead: bool = typer.Option(False, help="Step every iteration (for checking skip-ahead)."),
        out: OutFolder = None,
        steady_state: SteadyState = False,
        drop_fraction: DropFraction = DEFAULT_DROP_FRACTION,
        seeds: Seeds = 1,
        executor: Executor = "process",
        stream: Optional[bool] = typer.Option(
            None, "--stream/--no-stream",
            help=f"Stream: write each request's record as it ends and keep streaming statistics (memory flat in "
                 f"the number of requests; latency percentiles within 0.05% + 1 us). Default: on above "
                 f"{STREAM_ABOVE:,} requests."),
        records: str = typer.Option("csv", "--records", help="Streamed runs: csv | parquet (needs pyarrow)."),
    ) -> None:
        """Simulate one scenario (default: 4× Llama-3-8B on A100, 2,000 requests, 3 tiers) and print per-tier results
        with the queue's stability verdict."""
        from tierserve.report import render_summary
        if out is not None:
            check_out_dir(out)
        options = dict(model=model, gpu=gpu, tp=tp, replicas=replicas, local_policy=local_policy,
                       cluster_policy=cluster_policy, trace=trace, trace_format=trace_format, rate=rate,
                       num_requests=num_requests, seed=seed, time_limit=time_limit, no_skip_ahead=no_skip_ahead)
        if config is None and all(v is None for v in (local_policy, cluster_policy, trace, rate, replicas, model,
                                                       gpu, tp)):
            # The main job: the default scenario, FCFS baseline, tier priority and the tierserve stack side by side.
            from tierserve.experiments.scenario import default_load_note
            cfgs = _stack_configs(None, MAIN_JOB_STACKS, options)
            first = next(iter(cfgs.values()))
            c = first.cluster
            console.print(f"[bold]default scenario[/]: {c.num_replicas}× {c.replica.model} on {c.replica.gpu}, "
                          f"{first.workload.num_requests} requests, 3 tiers (enterprise mix); "
                          + default_load_note())
            console.print(f"{MAIN_JOB_STACKS[0]} is the FCFS baseline; {MAIN_JOB_STACKS[1]} changes only the "
                          f"replica's queue order (priority = tier); {MAIN_JOB_STACKS[2]} is the tier contract "
                          "(docs/contract.md)")
            _compare(console, cfgs, executor, out, steady_state, drop_fraction, seeds, metrics=MAIN_JOB_METRICS)
            return
        cfg = scenario_from_options(config, options)
        if records not in ("csv", "parquet"):
            raise ConfigError("--records", records, "csv | parquet")
        streamed = should_stream(cfg, stream) and not (steady_state or seeds > 1)
        if stream and (steady_state or seeds > 1):
            raise ConfigError("--stream", True, "a single whole-run simulation (not with --steady-state or --seeds)")
        if records != "csv" and not streamed:
            raise ConfigError("--records", records, "csv, unless the run is streamed (--stream)")
        if steady_state or seeds > 1:
            from tierserve.experiments.capacity import run_seeds
            frac = _drop_fraction(steady_state, drop_fraction)
            res = run_seeds(cfg, _seed_list(cfg.seed, seeds), frac, executor=executor, outdir=out)
            c = cfg.cluster
            console.print(f"[bold]{cfg.name}[/]: {c.num_replicas}× {c.replica.model} on {c.replica.gpu} "
                          f"TP{c.replica.tp}, {c.local_policy} + {c.cluster_policy}, "
                          f"{cfg.workload.num_requests} requests per seed")
            _print_seeds(console, {f"{c.local_policy}+{c.cluster_policy}": res}, frac)
            if out:
                console.print(f"wrote seed<N>/ (requests.csv, summary.json) and seeds.json under {shown(out)}/")
            return
        result = run_with_progress(cfg, console, streamed, out, records)
        c, s = cfg.cluster, result.sim.stats
        console.print(f"[bold]{cfg.name}[/]: {c.num_replicas}× {c.replica.model} on {c.replica.gpu} TP{c.replica.tp}, "
                      f"{c.local_policy} + {c.cluster_policy}, {len(result.workload.requests)} requests, seed {cfg.seed}")
        render_summary(result.summary, console=console)
        console.print(f"simulated {result.sim.duration_s:.1f} s in {s['wall_s']:.2f} s wall "
                      f"({len(result.workload.requests) / max(s['wall_s'], 1e-9):,.0f} req/s); "
                      f"{s['iterations']:,} iterations, {s['preemptions']} preemptions, "
                      f"KV use mean {s['kv_utilization_mean']:.1%} / max {s['kv_utilization_max']:.1%}")
        stability = result.stability if result.streamed else judge(result, drop_fraction=0.0).stability
        _print_verdicts(console, stability)
        if result.streamed:
            console.print(f"streamed: {result.summary.extras['streaming']['note']}")
        if out:
            result.summary.extras["stability"] = {k: v.to_dict() for k, v in stability.items()}
            paths = write_result(result, out)
            console.print("wrote " + ", ".join(shown(p) for p in paths.values()))

    @app.command()
    def compare(
        stacks: str = typer.Option("vllm+round_robin,sarathi+round_robin,vllm_priority+jsq",
                                   help="Comma-separated LOCAL+CLUSTER policy stacks."),
        config: ScenarioFile = None,
        replicas: Replicas = None,
        rate: Rate = None,
        num_requests: NumRequests = None,
        seed: Seed = None,
        executor: Executor = "process",
        out: OutFolder = None,
        steady_state: SteadyState = False,
        drop_fraction: DropFraction = DEFAULT_DROP_FRACTION,
        seeds: Seeds = 1,
    ) -> None:
        """Run several policy stacks on the same workload and print them side by side, with each stack's
        queue-stability verdict."""
        if out is not None:
            check_out_dir(out)
        names = [s.strip() for s in stacks.split(",") if s.strip()]
        cfgs = _stack_configs(config, names, dict(replicas=replicas, rate=rate, num_requests=num_requests, seed=seed))
        _compare(console, cfgs, executor, out, steady_state, drop_fraction, seeds)

    @app.command()
    def policies() -> None:
        """List the registered replica and cluster policies."""
        from tierserve.policies.cluster import CLUSTER_POLICIES
        from tierserve.policies.local import LOCAL_POLICIES
        console.print("local (replica): " + ", ".join(LOCAL_POLICIES.names))
        console.print("cluster (global): " + ", ".join(CLUSTER_POLICIES.names))


def _stack_configs(config: Optional[Path], stacks, options: dict[str, Any]) -> dict[str, ScenarioConfig]:
    """One scenario per LOCAL+CLUSTER stack, the same workload and seed for all."""
    if not stacks:
        raise ConfigError("--stacks", "", "at least one LOCAL+CLUSTER stack, e.g. vllm+round_robin")
    cfgs = {}
    for stack in stacks:
        local, _, glob = stack.partition("+")
        if not local or not glob:
            raise ConfigError("--stacks", stack, "LOCAL+CLUSTER, e.g. vllm+round_robin")
        cfgs[stack] = scenario_from_options(config, {**options, "local_policy": local, "cluster_policy": glob})
    return cfgs


def _compare(console: Console, cfgs: Mapping[str, ScenarioConfig], executor: str, out: Optional[Path],
             steady_state: bool, drop_fraction: float, seeds: int, metrics: Sequence[str] | None = None) -> None:
    """Run each stack (over seeds when asked) and print them side by side with their stability verdicts."""
    from tierserve.experiments.capacity import run_seed_job, run_seeds_many
    from tierserve.experiments.runs import run_many
    from tierserve.report import render_comparison
    first = next(iter(cfgs.values()))
    frac = _drop_fraction(steady_state, drop_fraction)
    if steady_state or seeds > 1:
        labelled = {stack.replace("+", "__"): c for stack, c in cfgs.items()}
        res = run_seeds_many(labelled, _seed_list(first.seed, seeds), frac, executor=executor, outdir=out)
        _print_seeds(console, {stack: res[label] for stack, label in zip(cfgs, labelled)}, frac)
        if out:
            console.print(f"wrote each stack's seed<N>/ outputs and seeds.json under {shown(out)}/")
        return
    jobs = [{"cfg": c.model_dump(mode="json"), "seed": c.seed, "drop_fraction": 0.0,
             "outdir": str(Path(out) / stack.replace("+", "__")) if out else None} for stack, c in cfgs.items()]
    try:
        runs = dict(zip(cfgs, run_many(run_seed_job, jobs, executor=executor, description="stacks")))
    except Interrupted as e:
        done = [stack for i, stack in enumerate(cfgs) if i in e.finished]
        Console(stderr=True).print("finished before the interrupt: " + (", ".join(done) or "none")
                                   + (f" (their outputs are under {shown(out)}/)" if out and done else ""))
        raise
    summaries = {stack: r.summary for stack, r in runs.items()}
    if metrics:
        render_comparison(summaries, metrics=metrics, console=console)
    else:
        render_comparison(summaries, console=console)
    for stack, r in runs.items():
        console.print(f"[bold]{stack}[/] queue: {_colour(r.verdict_line())}")
    if out:
        console.print(f"wrote each stack's requests.csv and summary.json under {shown(out)}/")


def _seed_list(first: int, n: int) -> list[int]:
    """`--seeds N`: the scenario's seed and the N − 1 after it."""
    return [first + i for i in range(n)]


def _drop_fraction(steady_state: bool, drop_fraction: float) -> float:
    """Statistics window: the stated fraction dropped at each end with --steady-state, else the whole run."""
    if not 0 <= drop_fraction < 0.5:
        raise ConfigError("--drop-fraction", drop_fraction, "a fraction in [0, 0.5)")
    return drop_fraction if steady_state else 0.0


def _colour(verdict: str) -> str:
    return f"[red]{verdict}[/]" if verdict.startswith(UNSTABLE) else f"[green]{verdict}[/]"


def _print_verdicts(console: Console, stability: Mapping[str, StabilityVerdict]) -> None:
    """One line per tier (and all): the queue-trend verdict and its numbers."""
    console.print("queue stability (work verdict: unfinished prefill + decode tokens vs run length, warm-up found "
                  "and dropped):")
    for name, v in stability.items():
        console.print(f"  {name}: {_colour(str(v))}")


_LABELS = {"slo_attainment": "SLO attainment", "goodput_rps": "goodput (req/s)"}


def _cell(metric: str, iv: Interval) -> str:
    from tierserve.report.tables import format_metric
    if iv.n == 0:
        return "–"
    mean = format_metric(metric, iv.mean)
    return f"{mean} ± {format_metric(metric, iv.half_width)}" if math.isfinite(iv.half_width) else mean


def _print_seeds(console: Console, results: Mapping[str, SeedsResult], drop_fraction: float) -> None:
    """Per tier and metric, mean ± 95% half-width over seeds for each stack; then each seed's verdict."""
    from rich.table import Table

    from tierserve.report.tables import metric_label
    first = next(iter(results.values()))
    n = len(first.runs)
    window = (f"steady state: first and last {drop_fraction:.0%} of arrivals dropped" if drop_fraction > 0
              else "whole run")
    spread = "mean ± 95% half-width (Student t)" if n > 1 else "one seed, no interval"
    console.print(f"seeds {first.seeds}; statistics over the {window}; {spread}")
    t = Table(title="Per tier over seeds", header_style="bold")
    t.add_column("tier", style="bold")
    t.add_column("metric")
    for stack in results:
        t.add_column(stack, justify="right")
    tiers = list(first.intervals)
    for i, tier in enumerate(tiers):
        metrics = list(first.intervals[tier])
        for j, m in enumerate(metrics):
            t.add_row(tier if j == 0 else "", _LABELS.get(m) or metric_label(m),
                      *[_cell(m, r.intervals.get(tier, {}).get(m, Interval(math.nan, math.nan, 0)))
                        for r in results.values()],
                      end_section=(j == len(metrics) - 1 and i < len(tiers) - 1))
    t.caption = ("latencies in ms over finished requests; goodput per s of the window's arrival span"
                 if drop_fraction > 0 else "latencies in ms over finished requests")
    console.print(t)
    v = Table(title="Queue stability per seed", header_style="bold")
    v.add_column("seed", style="bold")
    for stack in results:
        v.add_column(stack)
    for k in range(n):
        v.add_row(str(first.runs[k].seed), *[_colour(r.runs[k].verdict_line()) for r in results.values()])
    v.caption = "median TTFT trend over arrival order, each tier and all; unstable lists the entries that grow"
    console.print(v)
