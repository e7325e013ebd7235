"""tierserve.report: the rich tables render every tier and stack; plots write PNG files headlessly."""
from __future__ import annotations

import io

from rich.console import Console

from tierserve.core import SLO, Request, RequestState, Status
from tierserve.metrics import RequestTable, TokenTBT, summarize
from tierserve.report import render_comparison, render_summary
from tierserve.report.plots import plot_metric_vs, plot_ttft_cdf_by_tier


def _state(rid: int, tier: int, first: float, finish: float, status: Status = Status.FINISHED) -> RequestState:
    s = RequestState(Request(rid, 0.0, 10, 3, tier, SLO(ttft_s=1.0)))
    s.first_token_s, s.finish_s, s.status, s.num_generated = first, finish, status, 3 if finish >= 0 else 0
    return s


def scenario() -> tuple[list[RequestState], dict[int, str]]:
    """Tier 0: met, missed (TTFT 2 s), rejected; tier 1: met, censored, met -> 2/1/0 and 33.3% for tier 0."""
    states = [_state(0, 0, 0.5, 1.0), _state(1, 0, 2.0, 3.0), _state(2, 0, -1, -1, Status.REJECTED),
              _state(3, 1, 0.2, 0.5), _state(4, 1, 0.3, -1, Status.RUNNING), _state(5, 1, 0.1, 0.4)]
    return states, {2: "too large", 4: "time limit"}


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, record=True)


def test_render_summary_lists_tiers_and_all() -> None:
    s = summarize(RequestTable.from_states(*scenario()), TokenTBT([0.5], [0], [2]), 10.0, ["premium", "free"])
    c = _console()
    render_summary(s, c, title="demo")
    text = c.export_text()
    assert "premium" in text and "free" in text and "all" in text and "2/1/0" in text and "33.3%" in text


def test_render_comparison_side_by_side() -> None:
    t = RequestTable.from_states(*scenario())
    runs = {"edf": summarize(t, None, 10.0), "vllm": summarize(t, None, 20.0)}
    c = _console()
    render_comparison(runs, ["ttft.p99", "goodput_rps", "slo_attainment"], tiers=["all"], console=c)
    text = c.export_text()
    assert "edf" in text and "vllm" in text and "TTFT p99 (ms)" in text and "0.3" in text and "0.15" in text and "50.0%" in text


def test_plots_write_png(tmp_path) -> None:
    t = RequestTable.from_states(*scenario())
    p1 = plot_ttft_cdf_by_tier(t, tmp_path / "cdf.png", ["premium", "free"])
    p2 = plot_metric_vs([1, 2, 3], {"edf": [0.1, 0.2, 0.4], "vllm": [0.1, 0.3, 0.9]}, tmp_path / "sub" / "m.png",
                        "rate (req/s)", "p99 TTFT (s)", logy=True, hline=0.5)
    for p in (p1, p2):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
