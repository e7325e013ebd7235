"""Rich tables of run summaries: one run by tier, and several policy stacks side by side."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from tierserve.metrics.summary import ALL, RunSummary, TierSummary

# Metric names accepted by TierSummary.get; latencies are shown in ms.
DEFAULT_COMPARISON_METRICS: tuple[str, ...] = (
    "ttft.p50", "ttft.p99", "tbt.p50", "tbt.p99", "ttlt.p50", "ttlt.p99",
    "slo_attainment", "goodput_rps", "throughput_rps", "output_tokens_per_s",
)
_LATENCY_HEADS = ("ttft", "tbt", "tpot", "ttlt", "e2e", "normalized_latency")
_FRACTION_METRICS = ("slo_attainment", "tbt_max_attainment", "attainment_goal")


def _ms(x: float) -> str:
    return "–" if math.isnan(x) else f"{x * 1e3:.1f}"


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{x * 100:.1f}%"


def _num(x: float) -> str:
    if math.isnan(x):
        return "–"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def format_metric(metric: str, value: float) -> str:
    """Text for one metric value: ms for latencies, % for attainment, plain otherwise."""
    head = metric.partition(".")[0]
    if head in _LATENCY_HEADS and metric.partition(".")[2] != "n":
        return _ms(value)
    if metric in _FRACTION_METRICS:
        return _pct(value)
    return _num(value)


def metric_label(metric: str) -> str:
    head, _, sub = metric.partition(".")
    unit = " (ms)" if head in _LATENCY_HEADS and sub != "n" else ""
    label = {"ttlt": "E2E"}.get(head, head.replace("_", " ").upper() if head in _LATENCY_HEADS else head)
    return f"{label} {sub}{unit}".strip() if sub else f"{label}{unit}"


def _attainment_cell(s: TierSummary) -> str:
    txt = _pct(s.slo_attainment)
    if math.isnan(s.attainment_goal) or math.isnan(s.slo_attainment):
        return txt
    return f"[green]{txt}[/]" if s.meets_goal else f"[red]{txt}[/]"  # colour only when the tier has a goal


def summary_table(summary: RunSummary, title: str = "Run summary by tier") -> Table:
    """The per-tier table, without printing it."""
    t = Table(title=f"{title} ({summary.duration_s:.1f} s simulated)", header_style="bold")
    t.add_column("tier", style="bold")
    for col in ("n", "fin/rej/cens", "TTFT p50", "TTFT p99", "TBT p50", "TBT p99", "E2E p50", "E2E p99",
                "SLO att.", "goodput", "thru req/s", "out tok/s"):
        t.add_column(col, justify="right")
    for s in summary:
        t.add_row(
            s.name, str(s.total), f"{s.finished}/{s.rejected}/{s.censored}",
            _ms(s.ttft.p50), _ms(s.ttft.p99), _ms(s.tbt.p50), _ms(s.tbt.p99), _ms(s.ttlt.p50), _ms(s.ttlt.p99),
            _attainment_cell(s), _num(s.goodput_rps), _num(s.throughput_rps), _num(s.output_tokens_per_s),
            end_section=(s.name != ALL and s is summary.per_tier[-1]) if summary.per_tier else False,
        )
    t.caption = "latencies in ms over finished requests (TBT: token-level); goodput = SLO-meeting req/s"
    return t


def render_summary(summary: RunSummary, console: Console | None = None,
                   title: str = "Run summary by tier") -> Table:
    """Print the per-tier table (rows: tiers, then all) to `console` (stdout when None); returns it."""
    table = summary_table(summary, title)
    (console or Console()).print(table)
    return table


def comparison_table(summaries: Mapping[str, RunSummary],
                     metrics: Sequence[str] = DEFAULT_COMPARISON_METRICS,
                     tiers: Sequence[str] | None = None, title: str = "Policy comparison") -> Table:
    """Rows: (tier, metric); columns: one per stack. `tiers` defaults to every tier of the first run, then all."""
    if not summaries:
        raise ValueError("render_comparison: no summaries to compare")
    first = next(iter(summaries.values()))
    tier_list = list(tiers) if tiers is not None else list(first.tiers.keys())
    t = Table(title=title, header_style="bold")
    t.add_column("tier", style="bold")
    t.add_column("metric")
    for stack in summaries:
        t.add_column(stack, justify="right")
    for i, tier in enumerate(tier_list):
        for j, m in enumerate(metrics):
            cells = []
            for s in summaries.values():
                ts = s.tiers.get(tier)
                cells.append("–" if ts is None else format_metric(m, ts.get(m)))
            t.add_row(tier if j == 0 else "", metric_label(m), *cells,
                      end_section=(j == len(metrics) - 1 and i < len(tier_list) - 1))
    return t


def render_comparison(summaries: Mapping[str, RunSummary],
                      metrics: Sequence[str] = DEFAULT_COMPARISON_METRICS,
                      tiers: Sequence[str] | None = None, console: Console | None = None,
                      title: str = "Policy comparison") -> Table:
    """Print several runs (e.g. policy stacks) side by side; returns the table."""
    table = comparison_table(summaries, metrics, tiers, title)
    (console or Console()).print(table)
    return table
