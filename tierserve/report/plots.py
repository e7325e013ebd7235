"""PNG plots of runs. matplotlib is imported inside each function (Agg backend) so importing tierserve
stays fast and works without a display."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.metrics.records import RequestTable


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")  # headless: no display on cluster nodes or CI
    import matplotlib.pyplot as plt
    return plt


def _save(fig: Any, path: str | Path) -> Path:
    plt = _pyplot()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def plot_ttft_cdf_by_tier(table: RequestTable, path: str | Path,
                          tier_names: Sequence[str] | None = None, title: str = "TTFT by tier") -> Path:
    """Empirical CDF of TTFT (finished requests) per tier; dotted line at the tier's TTFT target, if any."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ttft, fin = table.ttft_s, table.finished
    for t in table.tiers:
        m = fin & (table.tier == t)
        x = np.sort(ttft[m])
        name = tier_names[t] if tier_names is not None and t < len(tier_names) else f"tier{t}"
        if x.size == 0:
            continue
        line, = ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=f"{name} (n={x.size})")
        slo = table.ttft_slo_s[table.tier == t]
        slo = slo[~np.isnan(slo)]
        if slo.size:
            ax.axvline(float(np.median(slo)), color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of finished requests")
    ax.set_ylim(0, 1.01)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return _save(fig, path)


def plot_metric_vs(xs: Sequence[float], series: Mapping[str, Sequence[float]], path: str | Path,
                   xlabel: str, ylabel: str, title: str | None = None, logy: bool = False,
                   hline: float | None = None) -> Path:
    """One line per series against `xs` (e.g. p99 TTFT vs request rate per policy); `hline` marks a target."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.asarray(xs, dtype=np.float64)
    for name, ys in series.items():
        y = np.asarray(ys, dtype=np.float64)
        if y.shape != x.shape:
            plt.close(fig)
            raise ValueError(f"series {name!r} has {y.size} points, xs has {x.size}")
        ax.plot(x, y, marker="o", markersize=3, label=name)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    if series:
        ax.legend()
    return _save(fig, path)
