"""benchmarks/sim_to_real.py: where the engine-side comparison starts each request (`engine_entry`).

Synthetic request logs with known step ends: a request stamped by the API server, queued by the engine core at
the end of the step in progress, and one queued on an idle core. No vLLM needed.
"""

import numpy as np
import pytest
from conftest import load_script



@pytest.fixture(scope="module")
def s2r():
    return load_script("benchmarks/sim_to_real.py", "sim_to_real_under_test")


def record(tier, arrival, queued, first_scheduled, first_token, gaps_ms):
    """One request-log record as the engine writes it (epoch s; the last token is stamped at the finish)."""
    return {"tier": tier, "arrival_s": arrival, "queued_s": queued, "first_scheduled_s": first_scheduled,
            "first_token_s": first_token, "finish_s": first_token + sum(gaps_ms) * 1e-3, "gaps_ms": gaps_ms}


T = 1_000_000.0         # an epoch-like offset: the boundary arithmetic must survive large stamps


def synthetic_log():
    """Steps end every 10 ms from T+0.010 to T+0.100 (a long-running request 0 shows them; its finish is
    stamped 0.3 ms before its last step's other tokens, as the engine does); then an idle gap."""
    steps = [T + 0.010 * k for k in range(1, 11)]
    background = record(0, T, T, T + 0.0001, steps[0], [10.0] * 9)
    background["finish_s"] -= 0.0003
    return {
        0: background,
        # stamped 25 ms before it was queued at the end of the step ending at T+0.050: the step before ended at
        # T+0.040, so it reached the core after T+0.040 (else that step's drain would have queued it)
        1: record(1, T + 0.025, T + 0.0502, T + 0.0504, steps[5], [10.0] * 4),
        # stamped during the step it waited for: it reached the core after its stamp
        2: record(2, T + 0.0445, T + 0.0502, T + 0.0504, steps[5], [10.0] * 4),
        # on an idle core (nothing runs after T+0.100): queued at once, 2 ms after the stamp
        3: record(2, T + 0.300, T + 0.302, T + 0.3023, T + 0.312, [10.0, 0.0, 10.0]),
    }


def test_step_ends_merge_one_steps_stamps(s2r):
    ends = s2r.step_ends(synthetic_log().values())
    # every 10 ms step once (finish 0.3 ms early and the rounded gaps merge into their step), then request 3's
    assert len(ends) == 10 + 3
    assert np.diff(ends).min() > 5e-3
    assert s2r.step_ends([]).size == 0


def test_queue_boundary_is_the_core_queue_entry_not_the_stamp(s2r):
    log = synthetic_log()
    stamp = s2r.engine_entry(log, "stamp")
    queue = s2r.engine_entry(log, "queue")
    assert stamp[1] == T + 0.025 and queue[1] == T + 0.0502
    trace = [{"i": i, "arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 5, "tier": log[i]["tier"]}
             for i in sorted(log)]
    arrived, real = s2r.engine_side_inputs(trace, log, queue)
    # the simulated engine gets each request at its queue entry (from the first), and real TTFT/TTLT run from it
    assert [q["arrival_s"] for q in arrived] == pytest.approx([0.0, 0.0502, 0.0502, 0.302], abs=1e-9)
    by_i = dict(zip(sorted(log), real))
    assert by_i[1]["ttft"] == pytest.approx(log[1]["first_token_s"] - (T + 0.0502), abs=1e-9)
    assert by_i[1]["ttlt"] == pytest.approx(log[1]["finish_s"] - (T + 0.0502), abs=1e-9)
    arrived_stamp, real_stamp = s2r.engine_side_inputs(trace, log, stamp)
    assert by_i[1]["ttft"] == pytest.approx(dict(zip(sorted(log), real_stamp))[1]["ttft"] - 0.0252, abs=1e-9)
    assert by_i[1]["tbt"] == pytest.approx([0.010] * 4)


def test_core_boundary_is_the_earliest_the_core_can_have_had_it(s2r):
    log = synthetic_log()
    core = s2r.engine_entry(log, "core")
    assert core[1] == pytest.approx(T + 0.040, abs=1e-6)        # the end of the step before the one it waited for
    assert core[2] == pytest.approx(T + 0.0445, abs=1e-9)       # its own stamp, inside the step it waited for
    assert core[3] == log[3]["queued_s"]                        # idle core: no step to wait for
    for i, e in log.items():
        assert e["arrival_s"] <= core[i] <= e["queued_s"]


def test_core_boundary_sees_a_step_no_token_shows(s2r):
    """A lone prompt's first chunk delivers no token: its start (a first_scheduled_s) still marks it."""
    log = synthetic_log()
    log[4] = record(1, T + 0.5000, T + 0.5000, T + 0.5003, T + 0.5600, [10.0])     # its chunk ran 0.5003-0.53
    log[5] = record(2, T + 0.5100, T + 0.5302, T + 0.5305, T + 0.5600, [10.0])     # queued when that chunk ended
    core = s2r.engine_entry(log, "core")
    assert core[5] == pytest.approx(T + 0.5100, abs=1e-9)       # busy: it reached the core after its stamp
    assert core[4] == log[4]["queued_s"]


def test_core_boundary_sees_a_lone_requests_last_step(s2r):
    """The only token of a request's last step is stamped at its finish: that step still ends there."""
    log = synthetic_log()
    log[6] = record(0, T + 1.0000, T + 1.0000, T + 1.0001, T + 1.0100, [10.0])      # alone; last step ends at 1.02
    log[7] = record(1, T + 1.0150, T + 1.0203, T + 1.0205, T + 1.0500, [10.0])     # queued when that step ended
    core = s2r.engine_entry(log, "core")
    assert core[7] == pytest.approx(T + 1.0150, abs=1e-9)


def test_unknown_boundary_is_named(s2r):
    with pytest.raises(ValueError, match="'arrival'"):
        s2r.engine_entry(synthetic_log(), "arrival")


def test_bracket_verdict_counts_cells_both_bounds_agree_on(s2r):
    def summary(ttft_p90):
        signed = {f"tier {t} {m} P{q}": 0.0 for t in range(3) for m in ("ttft", "tbt", "ttlt") for q in (50, 90, 99)}
        signed["tier 1 ttft P90"] = ttft_p90
        signed["tier 1 tbt P90"] = -50.0                # TBT and P99 cells are not the target's
        signed["tier 0 ttlt P99"] = 40.0
        return {"signed": signed}
    text = s2r.bracket_verdict([summary(-30.0), summary(-30.0)], [summary(-12.0), summary(+5.0)])
    assert "within 10% at both: 11 / 11" in text
    assert "same side at both: 1 / 0" in text
    assert "tier 1 ttft P90 -30..-12%" in text
