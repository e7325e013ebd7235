"""One self-contained HTML page for a run, a comparison, a sweep or a plan: plots embedded as base64 PNG
(matplotlib, Agg), tables as HTML, no scripts and nothing fetched. What a folder's files cannot show is said
on the page (e.g. KV use over time, which run outputs do not record).

    write_report(folder) -> Path        # folder/report.html
    detect(folder) -> "plan" | "sweep" | "comparison" | "run"
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core import ConfigError
from tierserve.report.plots import _pyplot

REPORT_HTML = "report.html"
RUN_FILES = ("summary.json",)


@dataclass
class Section:
    title: str
    notes: list[str] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)       # (caption, base64 PNG)
    tables: list[str] = field(default_factory=list)                   # HTML


def _png(fig: Any) -> str:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(x: Any, kind: str = "num") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if kind == "pct":
        return f"{100 * x:.1f}%"
    if kind == "ms":
        return f"{1e3 * x:.1f}"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


# ---- what is in a folder ---------------------------------------------------------------------------------------
def _run_dirs(folder: Path) -> dict[str, Path]:
    """Subfolders holding one run each (summary.json, or seed<N>/summary.json: the first seed's)."""
    out = {}
    for d in sorted(p for p in folder.iterdir() if p.is_dir()):
        if (d / "summary.json").is_file():
            out[d.name] = d
        else:
            seeds = sorted(d.glob("seed*/summary.json"))
            if seeds:
                out[d.name] = seeds[0].parent
    return out


def detect(folder: str | Path) -> str:
    f = Path(folder)
    if not f.is_dir():
        raise ConfigError("DIR", str(f), "a folder written by simulate/compare --out, sweep or plan")
    if (f / "plan.json").is_file():
        return "plan"
    if (f / "sweep.json").is_file():
        return "sweep"
    if (f / "summary.json").is_file():
        return "run"
    if _run_dirs(f):
        return "comparison"
    raise ConfigError("DIR", str(f), "a folder with plan.json (plan), sweep.json (sweep), summary.json (run) or "
                                     "subfolders with summary.json (compare --out)")


# ---- runs and comparisons ----------------------------------------------------------------------------------------
def _load_run(d: Path) -> Any:
    from tierserve.metrics.io import load_outputs
    return load_outputs(d)


def _tier_names(run: Any) -> dict[int, str]:
    return {s.tier: s.name for s in run.summary.per_tier}


def _cdf_section(runs: Mapping[str, Any]) -> Section:
    """Per-tier latency CDFs (TTFT and E2E), one line per run."""
    plt = _pyplot()
    sec = Section("Per-tier latency CDFs")
    first = next(iter(runs.values()))
    for metric, label in (("ttft_s", "TTFT (s)"), ("ttlt_s", "E2E latency (s)")):
        tiers = sorted(_tier_names(first))
        fig, axes = plt.subplots(1, len(tiers), figsize=(4.2 * len(tiers), 3.4), squeeze=False)
        for ax, t in zip(axes[0], tiers):
            for name, run in runs.items():
                tab = run.table
                m = tab.finished & (tab.tier == t)
                x = np.sort(getattr(tab, metric)[m])
                x = x[~np.isnan(x)]
                if x.size:
                    ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=f"{name} (n={x.size})")
            slo = getattr(first.table, metric.replace("_s", "_slo_s"))[first.table.tier == t]
            slo = slo[~np.isnan(slo)]
            if slo.size:
                ax.axvline(float(np.median(slo)), color="grey", linestyle=":", label="SLO target")
            ax.set_title(_tier_names(first)[t])
            ax.set_xlabel(label)
            ax.set_ylim(0, 1.01)
            ax.grid(alpha=0.3)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(plt.NullFormatter())   # labelled minor ticks overlap on short ranges
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        axes[0][0].set_ylabel("fraction of finished requests")
        sec.images.append((f"{label} CDF per tier (finished requests; dotted: the tier's target)", _png(fig)))
    return sec


def _percentile_section(runs: Mapping[str, Any]) -> Section:
    sec = Section("Percentiles per stack")
    header = ["run", "tier", "n", "fin/rej/cens", "TTFT p50 (ms)", "TTFT p99 (ms)", "TBT p99 (ms)",
              "E2E p50 (ms)", "E2E p99 (ms)", "SLO att.", "goal", "goodput (req/s)"]
    rows = []
    for name, run in runs.items():
        for s in run.summary:
            rows.append([name, s.name, s.total, f"{s.finished}/{s.rejected}/{s.censored}", _fmt(s.ttft.p50, "ms"),
                         _fmt(s.ttft.p99, "ms"), _fmt(s.tbt.p99, "ms"), _fmt(s.ttlt.p50, "ms"),
                         _fmt(s.ttlt.p99, "ms"), _fmt(s.slo_attainment, "pct"), _fmt(s.attainment_goal, "pct"),
                         _fmt(s.goodput_rps)])
    sec.tables.append(_table(header, rows))
    return sec


def _over_time_section(runs: Mapping[str, Any]) -> Section:
    """Queue length, deferrals (waiting for dispatch) and relegations over time, rebuilt from the records."""
    plt = _pyplot()
    sec = Section("Queues, deferrals and relegations over time")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for name, run in runs.items():
        t = run.table
        end = float(np.nanmax(np.concatenate([t.arrival_s, t.finish_s[~np.isnan(t.finish_s)]]))) if len(t) else 1.0
        grid = np.linspace(0.0, end, 200)
        first = np.where(np.isnan(t.first_token_s), np.inf, t.first_token_s)
        dispatch = np.where(np.isnan(t.dispatch_s), np.inf, t.dispatch_s)
        waiting = (t.arrival_s[None, :] <= grid[:, None]) & (first[None, :] > grid[:, None])
        deferred = (t.arrival_s[None, :] <= grid[:, None]) & (dispatch[None, :] > grid[:, None])
        axes[0].plot(grid, waiting.sum(axis=1), label=name)
        axes[1].plot(grid, deferred.sum(axis=1), label=name)
        rel = np.sort(t.relegated_s[~np.isnan(t.relegated_s)])
        axes[2].step(np.concatenate([[0.0], rel, [end]]), np.concatenate([[0], np.arange(1, rel.size + 1),
                                                                         [rel.size]]), where="post", label=name)
    for ax, title in zip(axes, ("requests waiting for their first token", "requests not yet dispatched "
                                "(deferred at the cluster)", "relegations (cumulative)")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("simulated time (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    sec.images.append(("rebuilt from each request's arrival, dispatch, first-token and relegation times", _png(fig)))
    kv = []
    for name, run in runs.items():
        e = run.summary.extras
        if "kv_utilization_mean" in e:
            kv.append(f"{name}: mean {_fmt(e['kv_utilization_mean'], 'pct')}, max {_fmt(e.get('kv_utilization_max'), 'pct')}")
    sec.notes.append("KV-cache use over time is not in the run outputs (requests.csv and summary.json record no time "
                     "series); summary.json has its mean and maximum" + (": " + "; ".join(kv) if kv else "") + ". "
                     "Migrations are recorded per request (a count), not when they happened: "
                     + "; ".join(f"{n}: {int(r.table.migrations.sum())} migrations" for n, r in runs.items()) + ".")
    return sec


def run_sections(runs: Mapping[str, Any]) -> list[Section]:
    return [_percentile_section(runs), _cdf_section(runs), _over_time_section(runs)]


# ---- sweeps ----------------------------------------------------------------------------------------------------
def _t95(n: int) -> float:
    from scipy import stats
    return float(stats.t.ppf(0.975, n - 1)) if n > 1 else math.nan


def sweep_sections(folder: Path) -> list[Section]:
    from tierserve.experiments.sweep import read_table
    meta = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    rows = read_table(folder / meta["table"])
    params = [f"param.{p}" for p in meta["params"]]
    xkey = next((p for p in ("rho", "param.rho", "param.rate", "rate") if rows and p in rows[0]), "rate")
    others = [p for p in params if p not in (xkey, "param.rate", "param.rho")]
    tiers = sorted({k.split(".")[0] for k in rows[0] if k.endswith(".slo_attainment")} - {"all"}) if rows else []
    sec = Section(f"Sweep {meta['name']}: {len(rows)} points ({' × '.join(meta['params'])} × seeds)")
    sec.notes.append(f"x axis: {xkey}; one line per {', '.join(o.removeprefix('param.') for o in others) or 'sweep'}; "
                     "mean over seeds with a 95% Student-t interval; hollow markers: a seed's queue was unstable")
    plt = _pyplot()
    for metric, label, scale in (("slo_attainment", "SLO attainment", 1.0), ("ttft.p99", "TTFT p99 (ms)", 1e3)):
        fig, axes = plt.subplots(1, len(tiers), figsize=(4.2 * len(tiers), 3.4), squeeze=False)
        for ax, tier in zip(axes[0], tiers):
            groups: dict[tuple, dict[float, list[dict]]] = {}
            for r in rows:
                groups.setdefault(tuple(r[o] for o in others), {}).setdefault(float(r[xkey]), []).append(r)
            for key, by_x in groups.items():
                xs = sorted(by_x)
                vals = [[float(r[f"{tier}.{metric}"]) * scale for r in by_x[x]
                         if r.get(f"{tier}.{metric}") is not None] for x in xs]
                mean = [float(np.nanmean(v)) if v else math.nan for v in vals]
                half = [(_t95(len(v)) * float(np.nanstd(v, ddof=1)) / math.sqrt(len(v))) if len(v) > 1 else 0.0
                        for v in vals]
                line = ax.errorbar(xs, mean, yerr=half, marker="o", markersize=4, capsize=3,
                                   label=" ".join(str(k) for k in key) or "all")
                bad = [x for x in xs if any(str(r.get("stable")) in ("False", "false") for r in by_x[x])]
                if bad:
                    ax.plot(bad, [mean[xs.index(x)] for x in bad], "o", mfc="white",
                            color=line.lines[0].get_color())
            goal = next((float(r[f"{tier}.attainment_goal"]) for r in rows
                         if r.get(f"{tier}.attainment_goal") is not None), math.nan)
            if metric == "slo_attainment" and not math.isnan(goal):
                ax.axhline(goal, color="grey", linestyle="--", linewidth=1, label="goal")
            ax.set_title(tier)
            ax.set_xlabel(xkey.removeprefix("param."))
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        sec.images.append((f"{label} vs {xkey.removeprefix('param.')} per tier", _png(fig)))
    unstable = sum(1 for r in rows if str(r.get("stable")) in ("False", "false"))
    sec.notes.append(f"{unstable} of {len(rows)} points have an unstable queue (their numbers describe a growing "
                     "queue, not a steady state)")
    return [sec]


# ---- plans -----------------------------------------------------------------------------------------------------
def plan_sections(folder: Path) -> list[Section]:
    doc = json.loads((folder / "plan.json").read_text(encoding="utf-8"))
    plt = _pyplot()
    out = []
    rows = doc["rows"]
    tiers = list(rows[0]["goals"]) if rows else []
    ranked = Section("Ranked fleets (the cheapest passing size of each GPU × TP × stack)")
    ranked.tables.append(_table(
        ["#", "fleet", "GPUs", "$/h", *[f"{t} att. / goal" for t in tiers], *[f"{t} head-room" for t in tiers]],
        [[r["rank"], f"{r['replicas']}× {r['gpu']} TP{r['tp']} {r['stack']}", r["gpus"], f"{r['cost_usd_h']:.2f}",
          *[f"{_fmt(r['attainment'][t], 'pct')} / {_fmt(r['goals'][t], 'pct')}" for t in tiers],
          *[_fmt(r["headroom"].get(t), "pct") if r["headroom"] else "–" for t in tiers]] for r in rows]))
    ranked.tables.append(_table(["#", "reproduce", "vLLM launch"], [[r["rank"], r["reproduce"], r["vllm"]] for r in rows]))
    ranked.notes.append(f"prices: {doc['price_source']}")
    out.append(ranked)
    par = Section("Cost / attainment Pareto front")
    fig, ax = plt.subplots(figsize=(7, 4))
    probes = [p for p in doc["probes"] if p["worst_margin"] is not None]
    for ok, colour, label in ((True, "tab:green", "meets every tier"), (False, "tab:red", "misses a tier")):
        pts = [p for p in probes if p["passes"] == ok]
        ax.scatter([p["cost_usd_h"] for p in pts], [100 * p["worst_margin"] for p in pts], c=colour, s=18,
                   alpha=0.7, label=label)
    front = doc["pareto"]
    ax.plot([p["cost_usd_h"] for p in front], [100 * p["worst_margin"] for p in front], "k--", linewidth=1,
            label="Pareto front")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("fleet cost ($/h)")
    ax.set_ylabel("worst tier: attainment − goal (points)")
    ax.set_ylim(max(-100, ax.get_ylim()[0]), ax.get_ylim()[1])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    par.images.append(("every probed fleet; the front keeps those no cheaper fleet beats", _png(fig)))
    par.tables.append(_table(["fleet", "$/h", "worst margin", "meets all"],
                             [[f"{p['replicas']}× {p['gpu']} TP{p['tp']} {p['stack']}", f"{p['cost_usd_h']:.2f}",
                               f"{100 * p['worst_margin']:+.1f} pt", "yes" if p["passes"] else "no"] for p in front]))
    out.append(par)
    if doc.get("burst"):
        b = doc["burst"]
        bs = Section(f"Burst what-if: rate × {b['factor']:g} for {b['length_s']:g} s from t = {b['start_s']:g} s")
        fig, ax = plt.subplots(figsize=(8, 3.6))
        for name, v in b["tiers"].items():
            x = np.asarray(v["bins_start_s"], dtype=float) + b["bin_s"] / 2
            y = np.asarray([np.nan if a is None else a for a in v["attainment"]], dtype=float)
            line, = ax.plot(x, 100 * y, marker=".", label=name)
            ax.axhline(100 * v["goal"], color=line.get_color(), linestyle=":", linewidth=1)
        ax.axvspan(b["start_s"], b["start_s"] + b["length_s"], color="orange", alpha=0.15, label="burst")
        ax.set_xlabel("arrival time (s)")
        ax.set_ylabel("SLO attainment per bin (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        bs.images.append((f"per {b['bin_s']:g} s bin of arrival time, pooled over seeds; dotted: each tier's goal",
                          _png(fig)))
        bs.notes.append(f"breaks first: {b.get('breaks_first') or 'no tier'}")
        bs.tables.append(_table(["tier", "overflow rule at the planned size"],
                                [[t, v["rule"]] for t, v in doc.get("overflow", {}).items()]))
        out.append(bs)
    if doc.get("pool_per_class"):
        pc = Section("A pool per class beside the shared fleet")
        pc.tables.append(_table(["pool", "fleet", "GPUs", "$/h"],
                                [[p["tier"], "–" if p.get("missing") else f"{p['replicas']}× {p['gpu']} TP{p['tp']}",
                                  p.get("gpus", "–"), _fmt(p.get("cost_usd_h"))] for p in doc["pool_per_class"]]
                                + ([["shared (chosen)", f"{rows[0]['replicas']}× {rows[0]['gpu']} TP{rows[0]['tp']}",
                                     rows[0]["gpus"], f"{rows[0]['cost_usd_h']:.2f}"]] if rows else [])))
        out.append(pc)
    return out


# ---- the page ----------------------------------------------------------------------------------------------------
_CSS = """body{font-family:system-ui,sans-serif;margin:24px;max-width:1400px;color:#222}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}figure{margin:10px 0}
figcaption{font-size:12px;color:#555}img{max-width:100%}.note{font-size:13px;color:#444}"""


def render(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1><p class='note'>{html.escape(subtitle)}</p>"]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        parts += [f"<p class='note'>{html.escape(n)}</p>" for n in s.notes]
        parts += s.tables
        parts += [f"<figure><img alt='{html.escape(c)}' src='data:image/png;base64,{b}'><figcaption>"
                  f"{html.escape(c)}</figcaption></figure>" for c, b in s.images]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write `report.html` for the folder (or `out`); returns its path."""
    from tierserve.core.files import write_text_atomic
    f = Path(folder)
    kind = detect(f)
    if kind == "plan":
        sections = plan_sections(f)
    elif kind == "sweep":
        sections = sweep_sections(f)
    elif kind == "run":
        sections = run_sections({f.name: _load_run(f)})
    else:
        sections = run_sections({name: _load_run(d) for name, d in _run_dirs(f).items()})
    page = render(f"tierserve {kind} report: {f.name}", f"from {f.resolve()}", sections)
    return write_text_atomic(Path(out) if out else f / REPORT_HTML, page)
