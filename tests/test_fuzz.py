"""Fuzzing the trace readers and the scenario schema (Hypothesis).

Every input must end one of two ways: a TierserveError that names a field, or a run in which every input
request is accounted for (one row per request, ids 0..n-1, each finished, rejected, censored or relegated, with
a reason when not finished) and carries exactly the token counts the file said. Examples are small so the whole
module runs in well under a minute on two cores.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tierserve.core.errors import ConfigError, InputError, TierserveError  # noqa: E402
from tierserve.core.request import Outcome  # noqa: E402
from tierserve.experiments.scenario import ScenarioConfig, run_scenario  # noqa: E402

# 60 examples per test in CI (the module takes ~15 s on 2 cores); TIERSERVE_FUZZ_EXAMPLES=2000 for a deep search.
N_EXAMPLES = int(os.environ.get("TIERSERVE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=N_EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL_CLUSTER = {"num_replicas": 2, "replica": {"max_model_len": 4096}}


def named_field(e: TierserveError) -> str:
    field = getattr(e, "field", None)
    assert isinstance(e, (ConfigError, InputError)), f"{type(e).__name__}: {e}"
    assert isinstance(field, str) and field, f"no field named in {e!r}"
    event(f"refused: {type(e).__name__}")
    return field


def check_accounted(res, n: int) -> None:
    t = res.table
    event("run" if n else "run of 0 requests")
    assert len(t) == n
    assert sorted(t["id"].tolist()) == list(range(n))
    reasons = t["reason"].tolist()
    for outcome, reason in zip(t["outcome"].tolist(), reasons):
        assert outcome in {o.value for o in Outcome}
        if outcome != Outcome.FINISHED:
            assert reason, "a request that did not finish has no reason"


def run_trace(path, fmt: str) -> object:
    """The trace replayed on a small cluster; TierserveError (with a field) or the run."""
    cfg = ScenarioConfig.from_dict({
        "cluster": SMALL_CLUSTER,
        "workload": {"num_requests": None, "arrivals": {"kind": "trace"}, "lengths": {"kind": "trace"},
                     "tiers": {"num_tiers": 3, "mix": "uniform"}, "trace": {"path": str(path), "format": fmt}}})
    return run_scenario(cfg)


# ---- trace files -------------------------------------------------------------------------------------------

TRICKY_CELLS = ["", " ", "0", "1", "-1", "7", " 12 ", "1.0", "2.5", "1e3", "1e30", "1_000", "nan", "inf", "-inf",
                "true", "0x10", "٣", "18446744073709551616", "1e17", "5e8", "3.", ".5", "+4", "1,000", "a\nb", '"']
cells = st.one_of(st.sampled_from(TRICKY_CELLS), st.integers(0, 3000).map(str),
                  st.floats(0, 1e4, allow_nan=False).map(repr), st.text(max_size=4))

FORMATS = {   # format → its columns (arrival first), and the token columns (prompt, output)
    "csv": (["arrival_s", "prompt_tokens", "output_tokens", "tier"], ("prompt_tokens", "output_tokens")),
    "vidur": (["arrived_at", "num_prefill_tokens", "num_decode_tokens"], ("num_prefill_tokens", "num_decode_tokens")),
}


@st.composite
def csv_traces(draw):
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    cols, (p_col, o_col) = FORMATS[fmt]
    header = draw(st.permutations(cols))
    if draw(st.booleans()):                      # damage the header: drop, duplicate or add a column
        header = draw(st.sampled_from([header[1:], header + [header[0]], header + ["extra"], header]))
    n = draw(st.integers(0, 8))
    arrivals = sorted(draw(st.lists(st.floats(0, 100), min_size=n, max_size=n)))
    rows = []
    for i in range(n):
        good = {header_col: "" for header_col in header}
        for c in header:
            if c in ("arrival_s", "arrived_at"):
                good[c] = repr(arrivals[i])
            elif c == "tier":
                good[c] = str(draw(st.integers(0, 2)))
            elif c == "extra":
                good[c] = "x"
            else:
                good[c] = str(draw(st.integers(1, 3000)))
        row = [good[c] for c in header]
        if draw(st.integers(0, 3)) == 0:         # damage a cell
            row[draw(st.integers(0, len(row) - 1))] = draw(cells)
        if draw(st.integers(0, 9)) == 0:         # damage the row's length
            row = row + [draw(cells)] if draw(st.booleans()) else row[:-1]
        rows.append(row)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    data = buf.getvalue().encode()
    if draw(st.integers(0, 9)) == 0:             # damage the bytes
        k = draw(st.integers(0, len(data)))
        data = data[:k] + draw(st.binary(min_size=1, max_size=3)) + data[k:]
    packed = draw(st.booleans())
    return fmt, (p_col, o_col), (gzip.compress(data) if packed else data), data


def _blank(row: list[str]) -> bool:
    return not row or (len(row) == 1 and row[0] != "" and not row[0].strip())


@FUZZ
@given(trace=csv_traces())
def test_csv_traces_are_refused_by_field_or_fully_accounted_for(tmp_path_factory, trace):
    fmt, (p_col, o_col), data, text_bytes = trace
    path = tmp_path_factory.mktemp("fuzz") / "trace.csv"
    path.write_bytes(data)
    try:
        res = run_trace(path, fmt)
    except TierserveError as e:
        named_field(e)
        return
    # What the accepted file says, read independently with the standard csv module (the bytes may have been
    # damaged after the rows were drawn, so the drawn rows are not the reference)
    text = text_bytes.decode("utf-8-sig")
    recs = [[c.strip() for c in r] for r in csv.reader(io.StringIO(text, newline=""))]
    recs = [r for r in recs if not _blank(r)]
    header, kept = recs[0], recs[1:]
    check_accounted(res, len(kept))
    pi, oi = header.index(p_col), header.index(o_col)
    # nothing altered: the file's token counts, exactly (the reader accepted them, so float() reads them too)
    want = sorted((int(float(r[pi])), int(float(r[oi]))) for r in kept)
    got = sorted(zip(res.table["prompt_tokens"].tolist(), res.table["output_tokens"].tolist()))
    assert got == want


json_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5000), st.integers(2**31, 2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
                        st.lists(st.integers(0, 3), max_size=2))


@st.composite
def mooncake_traces(draw):
    n = draw(st.integers(0, 8))
    t = sorted(draw(st.lists(st.integers(0, 100_000), min_size=n, max_size=n)))
    objs = []
    for i in range(n):
        o = {"timestamp": t[i], "input_length": draw(st.integers(1, 3000)),
             "output_length": draw(st.integers(1, 3000)), "hash_ids": [1, 2]}
        if draw(st.integers(0, 3)) == 0:
            o[draw(st.sampled_from(sorted(o)))] = draw(json_values)
        if draw(st.integers(0, 9)) == 0:
            o.pop(draw(st.sampled_from(sorted(o))))
        objs.append(o)
    lines = [json.dumps(o) for o in objs]
    if lines and draw(st.integers(0, 9)) == 0:
        lines[draw(st.integers(0, len(lines) - 1))] = draw(st.sampled_from(["{", "[]", "1", '{"a": 1, "a": 2}', " "]))
    return objs, lines, "\n".join(lines).encode() + b"\n"


@FUZZ
@given(trace=mooncake_traces())
def test_mooncake_traces_are_refused_by_field_or_fully_accounted_for(tmp_path_factory, trace):
    objs, lines, data = trace
    path = tmp_path_factory.mktemp("fuzz") / "trace.jsonl"
    path.write_bytes(data)
    try:
        res = run_trace(path, "mooncake")
    except TierserveError as e:
        named_field(e)
        return
    kept = [json.loads(ln) for ln in lines if ln.strip()]
    check_accounted(res, len(kept))
    want = sorted((int(o["input_length"]), int(o["output_length"])) for o in kept)
    assert sorted(zip(res.table["prompt_tokens"].tolist(), res.table["output_tokens"].tolist())) == want


@settings(FUZZ, max_examples=max(100, N_EXAMPLES))
@given(data=st.binary(max_size=300), fmt=st.sampled_from(["csv", "azure", "mooncake", "vidur"]))
def test_arbitrary_bytes_never_crash_a_reader(tmp_path_factory, data, fmt):
    from tierserve.workload import read_trace
    path = tmp_path_factory.mktemp("fuzz") / "trace"
    path.write_bytes(data)
    try:
        reqs = read_trace(path, fmt)
    except TierserveError as e:
        named_field(e)
        return
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 and 0 <= r.arrival_s <= 1e9 for r in reqs)


# ---- the scenario schema ---------------------------------------------------------------------------------------

_junk = [st.none(), st.booleans(), st.integers(-3, 40), st.floats(allow_nan=True, allow_infinity=True),
         st.text(max_size=6), st.lists(st.integers(-1, 3), max_size=3),
         st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)]
junk = st.one_of(*_junk, st.integers(2**53, 2**70))


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy = junk) -> st.SearchStrategy:
    """A good value three times in four, else a bad one (so that some examples get as far as a run)."""
    return st.integers(0, 3).flatmap(lambda i: bad if i == 0 else good)


# sizes (requests, replicas, tiers, segments) stay small when they are valid, so every accepted run is quick
small = mostly(st.integers(1, 6), st.one_of(st.integers(-2, 40), *_junk))

# (path, values a user might plausibly write there, good or bad)
FIELDS: list[tuple[tuple[str, ...], st.SearchStrategy]] = [
    (("seed",), mostly(st.integers(0, 10**20), st.one_of(st.integers(-3, -1), junk))),
    (("name",), mostly(st.text(max_size=10))),
    (("cluster", "num_replicas"), small),
    (("cluster", "local_policy"), mostly(st.sampled_from(["vllm", "vllm_priority", "sarathi", "orca", "vllm_v0",
                                                          "llumlet", "fifo"]))),
    (("cluster", "cluster_policy"), mostly(st.sampled_from(["round_robin", "random", "jsq", "infaas", "llumnix",
                                                            "llumnix_k", "nearest"]))),
    (("cluster", "local_policy_params"), mostly(st.fixed_dictionaries({}, optional={
        "long_prefill_threshold": mostly(st.integers(0, 600)),
        "preempt_mode": mostly(st.sampled_from(["recompute", "swap", "swpa"]))}))),
    (("cluster", "cluster_policy_params"), mostly(st.fixed_dictionaries({}, optional={
        "num_tiers": small, "hold_when_busy": mostly(st.booleans()),
        "migrate_threshold": mostly(st.floats(-10, 10))}))),
    (("cluster", "migration_params"), mostly(st.fixed_dictionaries({}, optional={
        "bandwidth_gbytes_s": mostly(st.floats(0.1, 100)), "max_stages": small}))),
    (("cluster", "time_limit_s"), mostly(st.floats(0.01, 100))),
    (("cluster", "skip_ahead"), mostly(st.booleans())),
    (("cluster", "replica", "tp"), mostly(st.sampled_from([1, 2]), small)),
    (("cluster", "replica", "block_size"), mostly(st.sampled_from([8, 16, 32]))),
    (("cluster", "replica", "num_blocks"), mostly(st.integers(1, 5000))),
    (("cluster", "replica", "gpu_memory_utilization"), mostly(st.floats(0.05, 1.0))),
    (("cluster", "replica", "model"), mostly(st.sampled_from(["Llama-3-8B", "gpt-9"]))),
    (("workload", "num_requests"), mostly(st.integers(1, 40), small)),
    (("workload", "seed"), mostly(st.integers(0, 10**20), st.one_of(st.integers(-3, -1), junk))),
    (("workload", "arrivals"), mostly(st.one_of(
        st.fixed_dictionaries({"kind": st.just("poisson"), "rate": mostly(st.floats(0.01, 1e3))}),
        st.fixed_dictionaries({"kind": st.just("gamma"), "rate": mostly(st.floats(0.01, 1e3)),
                               "cv": mostly(st.floats(0.001, 10))}),
        st.fixed_dictionaries({"kind": st.just("diurnal"), "mean_rate": mostly(st.floats(0.01, 100)),
                               "segments": small}),
        st.fixed_dictionaries({"kind": st.just("piecewise"), "rates": st.lists(mostly(st.floats(0, 50)), max_size=4),
                               "durations_s": st.lists(mostly(st.floats(0.1, 100)), max_size=4)})))),
    (("workload", "lengths"), mostly(st.one_of(
        st.fixed_dictionaries({"kind": st.just("choice"), "options": st.lists(st.fixed_dictionaries({
            "prompt": mostly(st.integers(1, 5000)), "output": mostly(st.integers(1, 500))}), max_size=3)}),
        st.fixed_dictionaries({"kind": st.just("fit"), "max_total_tokens": mostly(st.integers(2, 9000))})))),
    (("workload", "tiers"), mostly(st.fixed_dictionaries({
        "num_tiers": small, "mix": mostly(st.sampled_from(["uniform", "gaussian", "enterprise", "weights"])),
        "sigma": mostly(st.one_of(st.none(), st.floats(1e-300, 10)))}))),
    (("workload", "bogus"), junk),
]


@st.composite
def scenarios(draw):
    data: dict = {"cluster": {"num_replicas": 2}, "workload": {"num_requests": 20}}
    for path, values in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique_by=lambda f: f[0])):
        node = data
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = draw(values)
    return data


@FUZZ
@given(data=scenarios())
def test_scenarios_are_refused_by_field_or_run_with_every_request_accounted_for(data):
    try:
        cfg = ScenarioConfig.from_dict(data)
        if cfg.workload.num_requests > 40 or cfg.cluster.num_replicas > 40:
            pytest.fail(f"the strategy should keep sizes small: {cfg.workload.num_requests} requests, "
                        f"{cfg.cluster.num_replicas} replicas")
        res = run_scenario(cfg)
    except TierserveError as e:
        named_field(e)
        return
    check_accounted(res, cfg.workload.num_requests)
    assert all(math.isfinite(x) and x >= 0 for x in res.table["arrival_s"].tolist())


@settings(FUZZ, max_examples=max(100, N_EXAMPLES))
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_arbitrary_yaml_text_is_a_scenario_or_a_named_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        ScenarioConfig.from_yaml(path)
    except TierserveError as e:
        named_field(e)
