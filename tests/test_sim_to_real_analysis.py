"""benchmarks/sim_to_real.py's analysis of recorded runs: iteration rows assigned to runs by step ends (a late
flush must not shift them), the bootstrap interval of a real percentile, and the drift check of step times.
Synthetic inputs with known answers; no vLLM needed."""

import numpy as np
import pytest
from conftest import load_script

T = 1_000_000.0         # an epoch-like offset: the arithmetic must survive large stamps


@pytest.fixture(scope="module")
def s2r():
    return load_script("benchmarks/sim_to_real.py", "sim_to_real_analysis")


def one_request_run(start_s, step_ms, tokenless_ms=()):
    """A run of one request on an idle engine from `start_s`: `tokenless_ms` prefill chunks that deliver no
    token, then one step per token (the first delivers the first token). Its request record and its log rows."""
    t = start_s + sum(tokenless_ms) * 1e-3 + step_ms[0] * 1e-3
    record = {"tier": 0, "arrival_s": start_s, "queued_s": start_s, "first_scheduled_s": start_s,
              "first_token_s": t, "gaps_ms": list(step_ms[1:]), "finish_s": t + sum(step_ms[1:]) * 1e-3}
    rows = [{"measured_ms": f"{m:.4f}"} for m in (*tokenless_ms, *step_ms)]
    return record, rows


def step_times(seed, n):
    return list(np.random.default_rng(seed).uniform(4.0, 9.0, n).round(3))


def test_rows_go_to_the_run_whose_steps_they_are_despite_a_late_flush(s2r):
    rec_a, rows_a = one_request_run(T, [30.0] + step_times(1, 40))
    rec_b, rows_b = one_request_run(T + 5.0, [22.0] + step_times(2, 40), tokenless_ms=(41.0,))
    stray = [{"measured_ms": "7.7770"}]               # logged after every run's last step: claimed by none
    rows = rows_a + rows_b + stray
    # by count, as a late flush splits them: run b's slice would start 12 rows early (run a's last steps)
    assigned, report, unclaimed = s2r.assign_rows_by_step_ends(rows, {"a": [rec_a], "b": [rec_b]})
    assert assigned["a"] == list(range(len(rows_a)))
    assert assigned["b"] == list(range(len(rows_a), len(rows_a) + len(rows_b)))   # its tokenless chunk too
    assert unclaimed == [len(rows) - 1]
    assert report["b"]["unmatched_rows"] == 0 and report["b"]["unmatched_gaps"] == 0
    # each row's end is known: run b's tokenless chunk ended 41 ms after b started
    assert report["b"]["row_end"][len(rows_a)] == pytest.approx(T + 5.0 + 0.041, abs=1e-6)


def test_a_run_whose_steps_match_no_rows_is_reported_not_given_rows(s2r):
    rec_a, rows_a = one_request_run(T, [30.0] + step_times(1, 40))
    rec_c, _ = one_request_run(T + 9.0, [25.0] + step_times(3, 40))     # its rows are not in the log
    assigned, report, unclaimed = s2r.assign_rows_by_step_ends(rows_a, {"a": [rec_a], "c": [rec_c]})
    assert assigned["a"] == list(range(len(rows_a)))
    assert assigned["c"] == [] and "match no rows" in report["c"]["error"]
    assert unclaimed == []


def test_bootstrap_interval_covers_a_known_quantile_about_95_percent_of_the_time(s2r):
    true_p90 = np.log(10.0)                 # exponential(1): P(X > x) = e^-x
    rng = np.random.default_rng(7)
    covered = 0
    for rep in range(200):
        sample = rng.exponential(1.0, 200)
        lo, hi = s2r.bootstrap_quantile_ci(sample, quantiles=(90,), resamples=1000, seed=rep)[0]
        covered += lo <= true_p90 <= hi
    assert 0.88 <= covered / 200 <= 0.99     # 95% nominal; 200 trials give ±3% (1 s.d.)


def test_bootstrap_interval_is_deterministic_and_rejects_bad_input(s2r):
    sample = np.random.default_rng(3).lognormal(0, 1, 150)
    a = s2r.bootstrap_quantile_ci(sample, seed=11)
    assert np.array_equal(a, s2r.bootstrap_quantile_ci(sample, seed=11))
    assert not np.array_equal(a, s2r.bootstrap_quantile_ci(sample, seed=12))
    assert a.shape == (3, 2) and np.all(a[:, 0] <= a[:, 1])
    for q, (lo, hi) in zip((50, 90, 99), a):   # the point estimate lies inside its own interval
        assert lo <= np.percentile(sample, q) <= hi
    with pytest.raises(ValueError, match="values"):
        s2r.bootstrap_quantile_ci([])
    with pytest.raises(ValueError, match="resamples 10"):
        s2r.bootstrap_quantile_ci(sample, resamples=10)


COEF = np.array([3e-3, 40e-6, 0.5e-3, 0.0, 1e-6])     # s: c0, per prefill token, per decode, per pair, per context


def steps_with_ratio(ratio_per_step, seed):
    """Log rows whose measured step time is the COEF prediction × the given ratio per step."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in ratio_per_step:
        p, b = int(rng.integers(0, 3) == 0) * int(rng.integers(1, 257)), int(rng.integers(1, 9))
        ctx = int(rng.integers(b * 32, b * 400))
        t = COEF @ np.array([1, p, b, 0, ctx]) * r
        rows.append({"prefill_tokens": str(p), "decode_count": str(b), "prefill_attn_pairs": "0",
                     "decode_context_sum": str(ctx), "measured_ms": f"{t * 1e3:.4f}", "exclude": ""})
    return rows


def noisy(n, seed, slow_steps=0, slow=1.0):
    ratio = np.random.default_rng(seed).lognormal(0.0, 0.2, n)       # per-step scatter about the model
    ratio[:slow_steps] *= slow
    return ratio


def test_window_ratios_recover_a_slow_spell(s2r):
    rows = steps_with_ratio(noisy(1000, 1, slow_steps=400, slow=1.3), 2)
    windows = s2r.window_ratios(rows, COEF, 200)
    assert [(a, b) for a, b, _ in windows] == [(0, 200), (200, 400), (400, 600), (600, 800), (800, 1000)]
    assert all(r > 1.2 for _, _, r in windows[:2]) and all(r < 1.1 for _, _, r in windows[2:])
    assert len(s2r.window_ratios(rows[:1150 - 800], COEF, 200)) == 1      # a short remainder joins the last window
    with pytest.raises(ValueError, match="window_steps 0"):
        s2r.window_ratios(rows, COEF, 0)


def test_drift_flag_fires_on_a_slow_spell_and_rarely_on_a_steady_run(s2r):
    flagged_steady = flagged_slow = 0
    for seed in range(10):
        cal = {"before": steps_with_ratio(noisy(1000, 100 + seed), 200 + seed),
               "after": steps_with_ratio(noisy(1000, 300 + seed), 400 + seed)}
        deviations, spreads = s2r.calibration_window_deviations(cal, COEF, 200)
        assert len(deviations) == 10 and set(spreads) == {"before", "after"}
        steady = steps_with_ratio(noisy(3000, 500 + seed), 600 + seed)
        # the machine 1.27x slower for its first 600 steps, as s2 near capacity ran in its first 8 s
        slow = steps_with_ratio(noisy(3000, 500 + seed, slow_steps=600, slow=1.27), 600 + seed)
        lines, flag = s2r.drift_check("steady", steady, {"model": COEF}, deviations, 2, window_steps=200)
        flagged_steady += flag
        lines, flag = s2r.drift_check("slow", slow, {"model": COEF}, deviations, 2, window_steps=200)
        flagged_slow += flag
        assert "DRIFTED" in lines[-1] if flag else "steady" in lines[-1]
    assert flagged_slow == 10
    assert flagged_steady <= 2          # a P95 reference: about 1 in 20 steady runs is flagged by chance


def test_drift_threshold_grows_with_the_window_count_and_is_seeded(s2r):
    dev = np.random.default_rng(5).normal(1.0, 0.03, 12)
    assert s2r.drift_threshold(dev, 30, 2) > s2r.drift_threshold(dev, 4, 2)
    assert s2r.drift_threshold(dev, 30, 2) > dev.max() / dev.min()     # beyond the calibration windows' own range
    assert s2r.drift_threshold(dev, 10, 2) == s2r.drift_threshold(dev, 10, 2)
    assert s2r.drift_threshold(dev, 1, 2) == float("inf")
    with pytest.raises(ValueError, match="2 calibration windows for 2 runs"):
        s2r.drift_threshold(dev[:2], 10, 2)


def test_speed_windows_measure_each_window_against_the_fit(s2r):
    """10 ms steps predicted by the fit, measured 2× in the first second, 1× in the next, then a second with
    too few steps (keeps 1×), then 0.5×: the speed trace says exactly that, in seconds from t0."""
    coef = np.array([0.010, 0.0, 0.0, 0.0, 0.0])            # every step predicted 10 ms
    rows, ends, t = [], {}, T
    for k, (factor, n) in enumerate(((2.0, 40), (1.0, 80), (1.0, 2), (0.5, 150))):
        w_start = T + k * 1.0
        t = max(t, w_start)
        for j in range(n):
            step = len(rows)
            rows.append({"step": step, "prefill_tokens": 0, "decode_count": 1, "prefill_attn_pairs": 0,
                         "decode_context_sum": 0, "measured_ms": 10.0 * factor})
            t += 0.010 * factor
            ends[step] = t
    assert s2r.speed_windows(rows, coef, ends, T) == [(0.0, 2.0), (1.0, 1.0), (3.0, 0.5)]
    assert s2r.speed_windows(rows[:5], coef, {}, T) == []          # no step end known: no trace


def test_reanalysis_needs_the_recorded_seed(s2r, tmp_path, capsys):
    (tmp_path / "runs.json").write_text('{"seed": 11}')
    with pytest.raises(SystemExit):
        s2r.main(["--reanalyse", "--out", str(tmp_path), "--seed", "3"])
    assert "was recorded with seed 11" in capsys.readouterr().err
    (tmp_path / "runs.json").write_text('{}')
    with pytest.raises(SystemExit):
        s2r.main(["--reanalyse", "--out", str(tmp_path)])
    assert "does not record its seed" in capsys.readouterr().err
