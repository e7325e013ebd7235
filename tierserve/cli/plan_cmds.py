"""`tierserve plan`: the cheapest fleet meeting every tier of a traffic mix, with alternatives and what-ifs."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from tierserve.cli.options import PoolExecutor, PoolWorkers


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key or not val:
            from tierserve.core import ConfigError
            raise ConfigError(option, v, "GPU=VALUE, e.g. H100-80GB=2.5")
        out[key] = val
    return out


def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        mix: Optional[Path] = typer.Option(None, "--mix", "-m", help="Traffic mix YAML (rate or daily_rates, tiers "
                                                                    "with shares/SLOs/goals, lengths; see docs/planning.md)."),
        rate: Optional[float] = typer.Option(None, help="Override the mix's rate (req/s)."),
        gpus: Optional[str] = typer.Option(None, help="Comma-separated GPU types to consider."),
        tp: Optional[str] = typer.Option(None, help="Comma-separated TP degrees to consider."),
        stacks: Optional[str] = typer.Option(None, help="Comma-separated LOCAL+CLUSTER stacks to consider."),
        price: list[str] = typer.Option([], "--price", help="GPU=USD per GPU-hour (repeatable); overrides the defaults."),
        exec_model: list[str] = typer.Option([], "--exec-model", help="GPU=FILE: a calibrated model (from "
                                                                         "`tierserve calibrate --out`) for that GPU."),
        seeds: Optional[int] = typer.Option(None, min=1, help="Seeds per probe (default: the mix's, 3)."),
        top: int = typer.Option(5, min=1, help="How many ranked alternatives to print."),
        verify: bool = typer.Option(True, "--verify/--no-verify", help="Simulate the plan and its next-cheaper "
                                    "neighbour at new seeds (100-102): the plan must meet every tier, the neighbour miss one."),
        executor: PoolExecutor = "process",
        workers: PoolWorkers = None,
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for plan.json and one scenario per row "
                                                                       "(default: plans/<mix name>)."),
    ) -> None:
        """Search GPU type × TP × replicas × stack for the cheapest fleet that meets every tier's SLO goal, and
        print the ranked alternatives, the cost/attainment Pareto table, a burst what-if, the pool-per-class plan
        beside the shared one, each tier's overflow rule, and per row its reproduction and vLLM launch."""
        from tierserve.core.files import check_out_dir
        from tierserve.experiments.plan import PlanMix
        from tierserve.experiments.plan_whatif import plan_fleet
        from tierserve.experiments.plan_output import verify_plan, write_plan
        console = Console(width=max(Console().width, 200))
        data: dict[str, Any] = (PlanMix.from_yaml(mix) if mix else PlanMix()).model_dump(mode="json")
        if rate is not None:
            data["rate"], data["daily_rates"] = rate, None
        for key, text, conv in (("gpus", gpus, str), ("tp", tp, int), ("stacks", stacks, str)):
            if text:
                data["search"][key] = [conv(x.strip()) for x in text.split(",") if x.strip()]
        if seeds is not None:
            data["search"]["seeds"] = list(range(seeds))
        data["prices"].update({k: float(v) for k, v in _pairs(price, "--price").items()})
        data["exec_models"].update(_pairs(exec_model, "--exec-model"))
        the_mix = PlanMix.from_dict(data)
        folder = out or Path("plans") / the_mix.name
        check_out_dir(folder)
        print_mix(console, the_mix)
        result = plan_fleet(the_mix, executor=executor, workers=workers, top=top)
        paths = write_plan(result, folder)
        print_plan(console, result, paths["plan"])
        checked = ""
        if verify and result.chosen is not None:
            import time
            t0 = time.perf_counter()
            print_verification(console, verify_plan(result, executor=executor, workers=workers))
            checked = f", checked in {time.perf_counter() - t0:.0f} s"
        console.print(f"planned in {result.wall_s:.0f} s{checked}; wrote {paths['plan']} and {paths['rows']}/ "
                      f"(`tierserve report {folder}` draws it)")


def print_mix(console: Console, mix: Any) -> None:
    from tierserve.experiments.plan import PRICE_SOURCE, usable_stacks
    wl = mix.workload_config()
    tiers = wl.tiers.tier_set()
    shares = mix.shares()
    rate = (f"{mix.rate:g} req/s" if not mix.daily_rates else
            f"daily curve, {len(mix.daily_rates)} hours, peak {mix.peak_rate:g} req/s (sized for the peak)")
    console.print(f"[bold]plan {mix.name}[/]: {mix.model}, {rate}, {wl.num_requests} requests per probe, seeds "
                  f"{mix.search.seeds}")
    for t, share in zip(tiers, shares):
        s = t.slo
        parts = [f"TTFT ≤ {s.ttft_s:g} s" if s.ttft_s else "", f"TBT ≤ {1e3 * s.tbt_s:g} ms" if s.tbt_s else "",
                 f"E2E ≤ {s.ttlt_s:g} s" if s.ttlt_s else ""]
        console.print(f"  {t.name}: {share:.0%} of requests, {', '.join(p for p in parts if p)}, goal "
                      f"{s.attainment:.0%} attainment")
    ok, missing = usable_stacks(mix.search.stacks)
    console.print("search: GPUs " + ", ".join(f"{g} (${mix.price(g):.2f}/GPU-h)" for g in mix.search.gpus)
                  + f"; TP {mix.search.tp}; stacks {', '.join(ok)}"
                  + (f" (not registered, skipped: {', '.join(missing)})" if missing else ""))
    console.print(f"prices: {PRICE_SOURCE}")


def print_plan(console: Console, plan: Any, plan_path: Path) -> None:
    import json
    if plan.chosen is None:
        console.print("[bold red]no fleet in the search space meets every tier[/]; skipped configurations:")
        for s in plan.searches:
            console.print(f"  {s.gpu} TP{s.tp} {s.stack}: {s.skipped}")
        return
    tiers = list(plan.chosen.goals)
    t = Table(title="Cheapest fleets meeting every tier (one per GPU × TP × stack)", header_style="bold")
    for col in ("#", "fleet", "GPUs", "$/h"):
        t.add_column(col, justify="right" if col != "fleet" else "left")
    for name in tiers:
        t.add_column(f"{name} att. (goal {plan.chosen.goals[name]:.0%})", justify="right")
        t.add_column(f"{name} head-room", justify="right")
    t.add_column("stable seeds", justify="right")
    for i, p in enumerate(plan.ranked, 1):
        head = plan.headroom.get(p.fleet.label(), {})
        cells = []
        for name in tiers:
            cells.append(_pct(p.attainment[name]))
            h = head.get(name)
            top = head.get("search_top", 3.0)
            cells.append("–" if h is None or math.isnan(h) else (f"≥ +{h:.0%}" if h >= top - 1e-9 else f"+{h:.0%}"))
        t.add_row(str(i), f"{p.fleet.replicas}× {p.fleet.gpu} TP{p.fleet.tp} {p.fleet.stack}", str(p.fleet.gpus),
                  f"{p.cost_usd_h:.2f}", *cells, f"{p.stable_seeds}/{p.seeds_run}")
    t.caption = ("attainment pooled over the seeds in steady state; head-room (the 3 cheapest rows): extra load (whole mix "
                 "scaled) the tier absorbs before it misses its goal, from a capacity search (±5%) over \\[rate, rate × "
                 "r/(r − 1) × 1.1] when one replica fewer fails, else \\[rate, 4 × rate]; ≥: passed at the top")
    console.print(t)
    rows = json.loads(plan_path.read_text(encoding="utf-8"))["rows"]
    for row in rows:
        console.print(f"  #{row['rank']} reproduce: {row['reproduce']}", markup=False, highlight=False)
        console.print(f"      vLLM: {row['vllm']}", markup=False, highlight=False)
    front = Table(title="Cost / attainment Pareto front (probed fleets with a stable queue; worst tier's attainment − its goal)",
                  header_style="bold")
    for col in ("fleet", "$/h", "worst margin", *tiers, "meets all"):
        front.add_column(col, justify="left" if col == "fleet" else "right")
    for p in plan.pareto():
        front.add_row(p.fleet.label(), f"{p.cost_usd_h:.2f}", f"{100 * p.worst_margin:+.1f} pt",
                      *[_pct(p.attainment[x]) for x in tiers], "yes" if p.passes else "no")
    console.print(front)
    if plan.pool_per_class:
        pc = Table(title=f"A pool per class vs the shared fleet (each pool: {plan.chosen.fleet.gpu} "
                         f"TP{plan.chosen.fleet.tp} {plan.chosen.fleet.stack}, only its tier's requests)",
                   header_style="bold")
        for col in ("pool", "fleet", "GPUs", "$/h"):
            pc.add_column(col)
        total_gpus = 0
        for name, s in plan.pool_per_class:
            if s is None or s.best is None:
                pc.add_row(name, "no passing size found", "–", "–")
                continue
            total_gpus += s.best.fleet.gpus
            pc.add_row(name, s.best.fleet.label(), str(s.best.fleet.gpus), f"{s.best.cost_usd_h:.2f}")
        pool_cost = plan.pool_cost()
        pc.add_row("[bold]pools together[/]", "", str(total_gpus), f"{pool_cost:.2f}", end_section=True)
        pc.add_row("[bold]shared (chosen)[/]", plan.chosen.fleet.label(), str(plan.chosen.fleet.gpus),
                   f"{plan.chosen.cost_usd_h:.2f}")
        if not math.isnan(pool_cost) and pool_cost > 0:
            pc.caption = (f"sharing saves {1 - plan.chosen.cost_usd_h / pool_cost:.0%} of the pools' cost "
                          f"({total_gpus - plan.chosen.fleet.gpus:+d} GPUs for the pools)")
        console.print(pc)
    if plan.burst:
        b = plan.burst
        bt = Table(title=f"Burst what-if at {plan.chosen.fleet.label()}: rate × {b['factor']:g} for {b['length_s']:g} s "
                         f"from t = {b['start_s']:g} s", header_style="bold")
        for col in ("tier", "goal", "attainment in the burst", "misses its goal from", "recovered"):
            bt.add_column(col, justify="right" if col != "tier" else "left")
        for name, v in b["tiers"].items():
            brk = "never" if v["breaks_at_s"] is None else f"+{v['breaks_at_s']:.0f} s into the burst"
            rec = ("–" if v["recovery_s"] is None else
                   f"{v['recovery_s']:.0f} s after it ends" if v["recovered"] else "not within the run")
            bt.add_row(name, _pct(v["goal"]), _pct(v["window_attainment"]), brk, rec)
        bt.caption = (f"per {b['bin_s']:g} s bin of arrival time, pooled over the seeds; breaks first: "
                      f"{b['breaks_first'] or 'no tier'}")
        console.print(bt)
    if plan.overflow:
        console.print(f"[bold]overflow rules at {plan.chosen.fleet.label()}[/] "
                      f"(stack {plan.chosen.fleet.stack}, bursts of {plan.mix.burst.length_s:g} s):")
        for name, v in plan.overflow.items():
            console.print(f"  {name}: {v['rule']}")
    if plan.hourly:
        gpu_h = sum(plan.hourly) * plan.chosen.fleet.tp
        console.print(f"daily curve at {plan.chosen.fleet.gpu} TP{plan.chosen.fleet.tp} {plan.chosen.fleet.stack}: "
                      f"replicas per hour {plan.hourly}; {gpu_h} GPU-hours a day scaled per hour vs "
                      f"{24 * plan.chosen.fleet.gpus} held at the peak size")
    skipped = [s for s in plan.searches if s.best is None]
    if skipped:
        console.print("not in the ranking: " + "; ".join(f"{s.gpu} TP{s.tp} {s.stack}: {s.skipped}" for s in skipped),
                      markup=False, highlight=False)


def print_verification(console: Console, checks: list[Any]) -> None:
    t = Table(title="Verification at new seeds (every seed run)", header_style="bold")
    tiers = list(checks[0].probe.goals)
    for col in ("role", "fleet", "$/h", *tiers, "stable seeds", "meets every tier"):
        t.add_column(col, justify="left" if col in ("role", "fleet") else "right")
    for c in checks:
        p = c.probe
        t.add_row(c.role, p.fleet.label(), f"{p.cost_usd_h:.2f}",
                  *[f"{_pct(p.attainment[x])} / {p.goals[x]:.0%}" for x in tiers], f"{p.stable_seeds}/{p.seeds_run}",
                  "[green]yes[/]" if p.passes else "[red]no[/]")
    console.print(t)
    from tierserve.experiments.plan_output import check_outcome
    ok, line = check_outcome(checks)
    console.print(("[bold green]plan check passed[/]: " if ok else "[bold red]plan check failed[/]: ") + line,
                  highlight=False)
