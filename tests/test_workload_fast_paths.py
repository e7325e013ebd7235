"""The input side's fast paths give exactly what the general code gives: trace cells parsed once, full CSV rows
checked in fewer steps, `build_workload` built a block at a time; plus the GC setting runs use and the package
imports a plain run does not need."""
from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from tierserve.core.errors import TraceError
from tierserve.core.files import read_csv_table
from tierserve.core.gc_tuning import RUN_GEN0_THRESHOLD, collect_less_often
from tierserve.core.paths import shared_data
from tierserve.workload import readers
from tierserve.workload.config import RequestStream, WorkloadConfig, build_workload
from tierserve.workload.lengths import DATASETS

CELLS = ["0", "12", "007", "0.5", " 7 ", "1e3", "4.0", "4.5", "-3", "+5", "2147483647", "2147483648",
         "99999999999", "1_000", "١٢", "²", "nan", "NaN", "-inf", "Infinity", "abc", "", "1" * 5000,
         True, 3, 3.5, float("nan"), float("inf"), None]


def outcome(fn, *args):
    try:
        v = fn(*args)
        return "ok", v, type(v)
    except TraceError as e:
        return "error", str(e)


def reference_tokens(src, row, name, raw, minimum):
    """`_parse_tokens` as it was: every value through the general float parser."""
    return readers._parse_tokens_checked(src, row, name, raw, minimum)


@pytest.mark.parametrize("raw", CELLS, ids=[repr(c)[:12] for c in CELLS])
def test_cells_parse_as_the_general_path_does(raw):
    assert outcome(readers._parse_float, "f.csv", 3, "x", raw) == \
        outcome(readers._parse_float_checked, "f.csv", 3, "x", raw)
    for minimum in (0, 1):
        assert outcome(readers._parse_tokens, "f.csv", 3, "x", raw, minimum) == \
            outcome(reference_tokens, "f.csv", 3, "x", raw, minimum)


def test_full_rows_and_other_rows_read_alike(tmp_path, monkeypatch):
    p = tmp_path / "t.csv"
    p.write_text("a, b ,c\n 1,2 , 3\n\n   \n4,5,6\n\"7\",\" 8\",9\n")
    t = read_csv_table(p)
    assert t.header == ["a", "b", "c"] and t.rows == [["1", "2", "3"], ["4", "5", "6"], ["7", "8", "9"]]
    one = tmp_path / "one.csv"                 # one column: a whitespace-only line is blank, not a row
    one.write_text("a\n1\n   \n2\n")
    assert read_csv_table(one).rows == [["1"], ["2"]]
    long_cell = tmp_path / "long.csv"
    long_cell.write_text("a,b\n1,2\n3," + "x" * 5000 + "\n")
    assert read_csv_table(long_cell).rows[1][1] == "x" * 5000      # under the default cell limit (1 Mi characters)
    monkeypatch.setenv("TIERSERVE_MAX_CELL_CHARS", "4096")           # the limit is read when a file is read
    with pytest.raises(TraceError, match=r"row 2.*5000 characters.*at most 4,096") as ei:
        read_csv_table(long_cell, error=TraceError)
    assert ei.value.row == 2


WORKLOADS = [
    {"num_requests": 3000, "seed": 42, "arrivals": {"kind": "poisson", "rate": 40.0},
     "lengths": {"kind": "empirical", "dataset": "azure2023_conv", "max_total_tokens": 4096},
     "tiers": {"num_tiers": 3, "mix": "uniform"}},
    {"num_requests": 500, "seed": 3, "arrivals": {"kind": "gamma", "rate": 5.0, "cv": 2.0},
     "lengths": {"kind": "fit", "dataset": "azure2023_conv", "max_total_tokens": 2048},
     "tiers": {"num_tiers": 4, "mix": "enterprise"}},
]


def fingerprint(requests):
    return [(r.id, r.arrival_s.hex(), r.prompt_tokens, r.output_tokens, r.tier, r.slo, r.app,
             type(r.arrival_s), type(r.prompt_tokens), type(r.output_tokens), type(r.tier)) for r in requests]


NEEDS_TRACE = pytest.mark.skipif(shared_data(*DATASETS["azure2023_conv"][0]) is None,
                                 reason="../shared/data absent: the empirical azure2023_conv lengths skipped")


@pytest.mark.parametrize("data", [pytest.param(WORKLOADS[0], marks=NEEDS_TRACE), WORKLOADS[1]],
                         ids=["empirical_uniform", "fit_enterprise"])
@pytest.mark.parametrize("block", [None, 700])
def test_build_workload_equals_reading_the_stream(data, block):
    cfg = WorkloadConfig.from_dict(data)
    kw = {} if block is None else {"block": block}
    one_by_one = RequestStream(cfg, **kw)
    expected = fingerprint(list(one_by_one))
    if block is None:
        built = build_workload(cfg)
    else:       # build_workload's block path on several blocks
        import tierserve.workload.config as wc
        orig = wc.RequestStream
        wc.RequestStream = lambda c, s=None: orig(c, s, block)
        try:
            built = build_workload(cfg)
        finally:
            wc.RequestStream = orig
    assert fingerprint(built.requests) == expected
    assert built.num_clipped == one_by_one.num_clipped


def test_build_workload_from_a_trace_with_tiers_and_apps(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,tier,app\n"
                 + "".join(f"{0.1 * i},{10 + i},{5 + i % 3},{i % 2},app{i % 3}\n" for i in range(50)))
    cfg = WorkloadConfig.from_dict({"num_requests": 50, "arrivals": {"kind": "trace"}, "lengths": {"kind": "trace"},
                                    "trace": {"path": str(p), "format": "csv"},
                                    "tiers": {"num_tiers": 2, "from_trace": True}})
    assert fingerprint(build_workload(cfg).requests) == fingerprint(list(RequestStream(cfg)))
    assert {r.app for r in build_workload(cfg).requests} == {"app0", "app1", "app2"}


def test_collect_less_often_raises_then_restores_the_threshold():
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with collect_less_often():
            assert gc.get_threshold() == (RUN_GEN0_THRESHOLD, 10, 10)
            with collect_less_often():          # nested: no change
                assert gc.get_threshold()[0] == RUN_GEN0_THRESHOLD
            assert gc.get_threshold()[0] == RUN_GEN0_THRESHOLD
        assert gc.get_threshold() == (700, 10, 10)
        with pytest.raises(RuntimeError), collect_less_often():
            raise RuntimeError("inside")
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(0)                     # collection switched off by the caller: left off
        with collect_less_often():
            assert gc.get_threshold()[0] == 0
        gc.set_threshold(50_000, 5, 5)           # already collecting less often: left alone
        with collect_less_often():
            assert gc.get_threshold() == (50_000, 5, 5)
    finally:
        gc.set_threshold(*old)


def test_a_plain_run_does_not_import_what_it_does_not_use():
    """Reading a trace, simulating and writing the outputs imports neither the pydantic workload models, the
    experiments nor the stability statistics."""
    code = """
import sys, tempfile
from tierserve.metrics import RequestTable, TokenTBT, summarize
from tierserve.metrics.io import write_outputs
from tierserve.core import Request, TierSet
from tierserve.sim import ClusterConfig, simulate
from tierserve.workload import read_trace
with tempfile.TemporaryDirectory() as d:
    open(d + "/t.csv", "w").write("arrival_s,prompt_tokens,output_tokens\\n" +
                                  "".join(f"{0.2 * i},{100 + i},{20 + i}\\n" for i in range(30)))
    reqs = read_trace(d + "/t.csv")
    cfg = ClusterConfig(num_replicas=1, local_policy="vllm", cluster_policy="round_robin")
    sim = simulate(cfg, reqs)
    table = RequestTable.from_states(sim.states, sim.reasons)
    summary = summarize(table, TokenTBT.from_histograms(sim.tbt_by_tier), sim.duration_s, TierSet.default(1))
    write_outputs(d + "/out", table, summary, cfg.model_dump(mode="json"))
print(" ".join(m for m in ("tierserve.workload.config", "tierserve.experiments",
                           "tierserve.metrics.stability") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


ODD_CELLS = ["7", "007", "+5", "3.0", "1e3", "1_0", "١٢", "nan", "inf", "-0.0", "0", "-1", " 4 ", "",
             "2147483648", "12345678901", "0.5"]


def read_both_ways(monkeypatch, read):
    """(rows or error text) with the column-at-a-time paths, then with them switched off."""
    def run():
        try:
            res = read()
            return [(r.arrival_s if r.arrival_s is None else r.arrival_s.hex(), r.prompt_tokens, r.output_tokens,
                     r.tier, r.app, type(r.prompt_tokens), type(r.tier)) for r in res.rows], res.num_clamped
        except TraceError as e:
            return str(e)
    fast = run()
    with monkeypatch.context() as m:
        m.setattr(readers, "_plain_columnar_rows", lambda *a: None)
        m.setattr(readers, "_plain_vidur_run_rows", lambda *a: None)
        slow = run()
    return fast, slow


@pytest.mark.parametrize("column", ["arrival_s", "prompt_tokens", "output_tokens", "tier"])
@pytest.mark.parametrize("cell", ODD_CELLS + ["3"])         # "3": tier K (outside 0..2)
@pytest.mark.parametrize("min_output", [None, 1])
def test_csv_columns_at_once_equal_cell_by_cell(tmp_path, monkeypatch, column, cell, min_output):
    rows = [{"arrival_s": f"{0.5 * i}", "prompt_tokens": f"{10 + i}", "output_tokens": f"{1 + i}",
             "tier": f"{i % 3}", "app": f"a{i}"} for i in range(6)]
    rows[3][column] = cell
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,tier,app\n"
                 + "".join(",".join(r.values()) + "\n" for r in rows))
    fast, slow = read_both_ways(monkeypatch, lambda: readers.read_csv_rows(p, num_tiers=3, min_output=min_output))
    assert fast == slow


@pytest.mark.parametrize("column", ["Request Id", "request_num_prefill_tokens", "request_num_decode_tokens",
                                    "Time (sec)"])
@pytest.mark.parametrize("cell", ODD_CELLS + ["5"])         # "5": a duplicate request id
def test_vidur_run_columns_at_once_equal_cell_by_cell(tmp_path, monkeypatch, column, cell):
    metrics = [{"Request Id": f"{i}", "request_num_prefill_tokens": f"{10 + i}",
                "request_num_decode_tokens": f"{1 + i}"} for i in (2, 0, 5, 1, 4, 3)]      # rows not in id order
    arrivals = [{"Time (sec)": f"{0.25 * i}"} for i in range(6)]
    (metrics[3] if column in metrics[3] else arrivals[3])[column] = cell
    (tmp_path / "request_metrics.csv").write_text(
        "Request Id,request_num_prefill_tokens,request_num_decode_tokens\n"
        + "".join(",".join(r.values()) + "\n" for r in metrics))
    (tmp_path / "request_arrival_time_series.csv").write_text(
        "Time (sec)\n" + "".join(r["Time (sec)"] + "\n" for r in arrivals))
    fast, slow = read_both_ways(monkeypatch, lambda: readers.read_vidur_run_rows(tmp_path, min_output=None))
    assert fast == slow
