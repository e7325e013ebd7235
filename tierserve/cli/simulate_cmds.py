"""`tierserve simulate`, `tierserve compare`, `tierserve policies`."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from tierserve.experiments.scenario import ScenarioConfig, ScenarioResult, run_scenario, write_result


def scenario_from_options(config: Optional[Path], overrides: dict[str, Any]) -> ScenarioConfig:
    """A scenario file (or the default scenario) with command-line flags applied on top, then validated."""
    base = ScenarioConfig.from_yaml(config) if config else ScenarioConfig()
    data = base.model_dump(mode="json", exclude_unset=False)
    cl, rep, wl = data["cluster"], data["cluster"]["replica"], data["workload"]
    o = {k: v for k, v in overrides.items() if v is not None}
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


def run_with_progress(cfg: ScenarioConfig, console: Console) -> ScenarioResult:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed}/{task.total} requests"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("sim", total=cfg.workload.num_requests or 0)
        return run_scenario(cfg, progress=lambda done, total: bar.update(task, completed=done, total=total))


def register(app: typer.Typer, console: Console) -> None:
    @app.command()
    def simulate(
        config: Optional[Path] = typer.Option(None, "--config", "-c", help="Scenario YAML (see examples/)."),
        model: Optional[str] = typer.Option(None, help="Model, e.g. Llama-3-8B."),
        gpu: Optional[str] = typer.Option(None, help="GPU: A100-80GB, H100-80GB, H200."),
        tp: Optional[int] = typer.Option(None, help="Tensor-parallel degree."),
        replicas: Optional[int] = typer.Option(None, help="Number of replicas."),
        local_policy: Optional[str] = typer.Option(None, "--local-policy", "-l", help="Replica scheduler."),
        cluster_policy: Optional[str] = typer.Option(None, "--cluster-policy", "-g", help="Global scheduler."),
        trace: Optional[Path] = typer.Option(None, help="Replay a trace file instead of the synthetic workload."),
        trace_format: Optional[str] = typer.Option(None, help="csv | azure | mooncake | vidur | vidur_run."),
        rate: Optional[float] = typer.Option(None, help="Arrival rate (req/s), Poisson."),
        num_requests: Optional[int] = typer.Option(None, "--num-requests", "-n", help="Number of requests."),
        seed: Optional[int] = typer.Option(None, help="Random seed."),
        time_limit: Optional[float] = typer.Option(None, help="Stop at this simulated time (s); the rest is censored."),
        no_skip_ahead: bool = typer.Option(False, help="Step every iteration (for checking skip-ahead)."),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write requests.csv, summary.json here."),
    ) -> None:
        """Simulate one scenario (default: 4× Llama-3-8B on A100, 2,000 requests, 3 tiers) and print per-tier results."""
        from tierserve.report import render_summary
        cfg = scenario_from_options(config, dict(model=model, gpu=gpu, tp=tp, replicas=replicas,
                                                 local_policy=local_policy, cluster_policy=cluster_policy,
                                                 trace=trace, trace_format=trace_format, rate=rate,
                                                 num_requests=num_requests, seed=seed, time_limit=time_limit,
                                                 no_skip_ahead=no_skip_ahead))
        result = run_with_progress(cfg, console)
        c, s = cfg.cluster, result.sim.stats
        console.print(f"[bold]{cfg.name}[/]: {c.num_replicas}× {c.replica.model} on {c.replica.gpu} TP{c.replica.tp}, "
                      f"{c.local_policy} + {c.cluster_policy}, {len(result.workload.requests)} requests, seed {cfg.seed}")
        render_summary(result.summary, console=console)
        console.print(f"simulated {result.sim.duration_s:.1f} s in {s['wall_s']:.2f} s wall "
                      f"({len(result.workload.requests) / max(s['wall_s'], 1e-9):,.0f} req/s); "
                      f"{s['iterations']:,} iterations, {s['preemptions']} preemptions, "
                      f"KV use mean {s['kv_utilization_mean']:.1%} / max {s['kv_utilization_max']:.1%}")
        if out:
            paths = write_result(result, out)
            console.print("wrote " + ", ".join(str(p) for p in paths.values()))

    @app.command()
    def compare(
        stacks: str = typer.Option("vllm+round_robin,sarathi+round_robin,vllm_priority+jsq",
                                   help="Comma-separated LOCAL+CLUSTER policy stacks."),
        config: Optional[Path] = typer.Option(None, "--config", "-c", help="Scenario YAML."),
        replicas: Optional[int] = typer.Option(None, help="Number of replicas."),
        rate: Optional[float] = typer.Option(None, help="Arrival rate (req/s)."),
        num_requests: Optional[int] = typer.Option(None, "--num-requests", "-n"),
        seed: Optional[int] = typer.Option(None),
        executor: str = typer.Option("process", help="serial | process | ray."),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write each stack's outputs under this folder."),
    ) -> None:
        """Run several policy stacks on the same workload and print them side by side."""
        from tierserve.core import ConfigError
        from tierserve.experiments.sweep import run_many
        from tierserve.report import render_comparison
        cfgs = {}
        for stack in [s.strip() for s in stacks.split(",") if s.strip()]:
            local, _, glob = stack.partition("+")
            if not glob:
                raise ConfigError("--stacks", stack, "LOCAL+CLUSTER, e.g. vllm+round_robin")
            cfgs[stack] = scenario_from_options(config, dict(local_policy=local, cluster_policy=glob, replicas=replicas,
                                                             rate=rate, num_requests=num_requests, seed=seed))
        jobs = [{"cfg": c.model_dump(mode="json"), "outdir": str(Path(out) / stack.replace("+", "__")) if out else None}
                for stack, c in cfgs.items()]
        summaries = dict(zip(cfgs, run_many(_run_summary, jobs, executor=executor, description="stacks")))
        render_comparison(summaries, console=console)
        if out:
            console.print(f"wrote each stack's requests.csv and summary.json under {out}/")

    @app.command()
    def policies() -> None:
        """List the registered replica and cluster policies."""
        from tierserve.policies.cluster import CLUSTER_POLICIES
        from tierserve.policies.local import LOCAL_POLICIES
        console.print("local (replica): " + ", ".join(LOCAL_POLICIES.names))
        console.print("cluster (global): " + ", ".join(CLUSTER_POLICIES.names))


def _run_summary(cfg: dict, outdir: str | None = None):
    """Process-pool worker: run a scenario, write its outputs if asked, return its summary (picklable)."""
    result = run_scenario(ScenarioConfig.from_dict(cfg))
    if outdir:
        write_result(result, outdir)
    return result.summary
