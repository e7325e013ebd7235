"""Arrival processes, length distributions and tier mixes hit their targets for a fixed seed."""
from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError, TraceError
from tierserve.core.paths import shared_data
from tierserve.workload import (
    ChoiceLengths, EmpiricalLengths, GammaArrivals, PiecewiseRateArrivals, PoissonArrivals, TraceArrivals,
    clip_total_tokens, default_slos, diurnal, enterprise_mix, explicit_mix, fitted_lengths, gaussian_mix,
    load_length_fits, niyama_tier_set, servegen, tier_mix, uniform_mix, assign_tiers,
)


def rng(seed: int = 7) -> np.random.Generator:
    return np.random.default_rng(seed)


def rate_and_cv(t: np.ndarray) -> tuple[float, float]:
    gaps = np.diff(np.concatenate(([0.0], t)))
    return len(t) / t[-1], float(gaps.std() / gaps.mean())


def test_poisson_hits_rate_and_unit_cv():
    t = PoissonArrivals(12.0).sample(50_000, rng())
    r, cv = rate_and_cv(t)
    assert np.all(np.diff(t) >= 0) and t[0] > 0
    assert r == pytest.approx(12.0, rel=0.02) and cv == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_hits_rate_and_cv(cv):
    r, got = rate_and_cv(GammaArrivals(5.0, cv).sample(100_000, rng()))
    assert r == pytest.approx(5.0, rel=0.05) and got == pytest.approx(cv, rel=0.05)


def test_piecewise_rate_follows_each_segment_and_skips_zero_rate():
    p = PiecewiseRateArrivals((2.0, 0.0, 8.0), (100.0, 50.0, 100.0))
    t = p.sample(20_000, rng())
    phase = t % p.period_s
    periods = t[-1] / p.period_s
    assert np.count_nonzero((phase >= 100) & (phase < 150)) == 0
    assert np.count_nonzero(phase < 100) / (100 * periods) == pytest.approx(2.0, rel=0.05)
    assert np.count_nonzero(phase >= 150) / (100 * periods) == pytest.approx(8.0, rel=0.05)
    assert len(t) / t[-1] == pytest.approx(p.mean_rate, rel=0.05)


def test_diurnal_keeps_mean_and_peaks_mid_period():
    d = diurnal(4.0, amplitude=0.5, period_s=3600.0)
    assert d.mean_rate == pytest.approx(4.0) and max(d.rates) == pytest.approx(6.0, rel=0.01)
    t = d.sample(40_000, rng())
    assert len(t) / t[-1] == pytest.approx(4.0, rel=0.03)


def test_servegen_shape_rescaled_to_target_mean():
    if shared_data("traces", "distributions", "servegen_deepseek_r1_rate.csv") is None:
        pytest.skip("shared ServeGen rate series absent")
    s = servegen("deepseek_r1", 10.0, period_s=3600.0)
    assert s.mean_rate == pytest.approx(10.0) and s.period_s == pytest.approx(3600.0) and len(s.rates) == 144
    t = s.sample(36_000, rng())
    assert len(t) / t[-1] == pytest.approx(10.0, rel=0.03)
    with pytest.raises(ConfigError, match="arrivals.model"):
        servegen("gpt5", 1.0)


def test_trace_replay_rescales_to_target_rate_and_checks_length():
    base = tuple(np.cumsum(np.full(101, 0.5)) + 3.0)  # 2 req/s starting at 3 s
    t = TraceArrivals(base).sample(101, rng())
    assert t.tolist() == list(base)  # replayed exactly, no rebasing
    t2 = TraceArrivals(base, target_rate=8.0).sample(101, rng())
    assert 100 / (t2[-1] - t2[0]) == pytest.approx(8.0)
    with pytest.raises(ConfigError, match="num_requests"):
        TraceArrivals(base).sample(102, rng())
    spread = TraceArrivals((0.0, 0.0, 0.0, 3.0, 3.0), tick_s=3.0).sample(5, rng())
    assert np.all(np.diff(spread) >= 0) and spread[2] < 3.0 + 3.0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_arrival_parameters_are_validated(bad):
    with pytest.raises(ConfigError, match="arrivals.rate"):
        PoissonArrivals(bad)


def test_fits_file_covers_every_dataset_and_samples_in_range():
    fits = load_length_fits()["fits"]
    assert set(fits) >= {"azure2023_conv", "azure2023_code", "sharegpt", "arxiv", "mooncake_conversation",
                         "deepseek_r1"}
    for name in fits:
        f = fitted_lengths(name)
        p, o = f.sample(5_000, rng())
        assert p.min() >= f.prompt_range[0] and p.max() <= f.prompt_range[1]
        assert o.min() >= max(1, f.output_range[0]) and o.max() <= f.output_range[1]


MEAN_TOL = 0.03  # fitted means are within 3% of the data (scripts/fit_lengths.py output: all within 2%)


@pytest.mark.parametrize("name", ["azure2023_conv", "azure2023_code", "sharegpt", "arxiv", "mooncake_conversation"])
def test_fit_matches_data_mean(name):
    try:
        data = EmpiricalLengths.from_dataset(name)
    except ConfigError:
        pytest.skip(f"shared dataset {name} absent")
    p, o = fitted_lengths(name).sample(200_000, rng(1))
    assert p.mean() == pytest.approx(np.mean(data.prompts), rel=MEAN_TOL)
    assert o.mean() == pytest.approx(np.mean(data.outputs), rel=MEAN_TOL)


def test_deepseek_fit_matches_pmf_mean():
    path = shared_data("traces", "distributions", "servegen_deepseek_r1_length_pmf.csv")
    if path is None:
        pytest.skip("ServeGen PMF absent")
    arr = np.loadtxt(path, delimiter=",", skiprows=1)
    p, o = fitted_lengths("deepseek_r1").sample(200_000, rng(1))
    assert p.mean() == pytest.approx(np.dot(arr[:, 0], arr[:, 1]) / arr[:, 1].sum(), rel=MEAN_TOL)
    assert o.mean() == pytest.approx(np.dot(arr[:, 0], arr[:, 2]) / arr[:, 2].sum(), rel=MEAN_TOL)


def test_empirical_samples_pairs_jointly_and_without_replacement():
    e = EmpiricalLengths((1, 2, 3, 4), (10, 20, 30, 40), replace=False)
    p, o = e.sample(4, rng())
    assert sorted(p) == [1, 2, 3, 4] and np.all(o == p * 10)
    with pytest.raises(ConfigError, match="num_requests"):
        e.sample(5, rng())


def test_choice_lengths_frequencies():
    c = ChoiceLengths((125, 2000), (100, 6000), (0.9, 0.1))
    p, o = c.sample(20_000, rng())
    assert np.mean(p == 2000) == pytest.approx(0.1, abs=0.01) and np.all((p == 2000) == (o == 6000))


def test_clip_is_counted_and_cuts_only_the_prompt():
    res = clip_total_tokens(np.array([4000, 100, 5000]), np.array([200, 50, 10]), 4096)
    assert res.prompts.tolist() == [3896, 100, 4086] and res.outputs.tolist() == [200, 50, 10]
    assert res.num_clipped == 2
    with pytest.raises(TraceError) as ei:
        clip_total_tokens(np.array([10, 10]), np.array([5, 4096]), 4096)
    assert ei.value.row == 1 and ei.value.field == "output_tokens"


def test_tier_mix_weights():
    assert uniform_mix(4).tolist() == [0.25] * 4
    assert enterprise_mix(3).tolist() == pytest.approx([0.1, 0.7, 0.2])
    assert enterprise_mix(5).tolist() == pytest.approx([0.1, 0.7 / 3, 0.7 / 3, 0.7 / 3, 0.2])
    assert enterprise_mix(2).tolist() == pytest.approx([0.1, 0.9]) and enterprise_mix(1).tolist() == [1.0]
    g = gaussian_mix(5)
    assert g.argmax() == 2 and g[0] == pytest.approx(g[4]) and g.sum() == pytest.approx(1.0)
    assert explicit_mix([1, 1, 2]).tolist() == [0.25, 0.25, 0.5]
    with pytest.raises(ConfigError, match="tiers.weights"):
        explicit_mix([1, -1], 2)
    with pytest.raises(ConfigError, match="tiers.mix"):
        tier_mix("pyramid", 3)


@pytest.mark.parametrize("kind", ["uniform", "gaussian", "enterprise"])
def test_assigned_tier_frequencies_match_mix(kind):
    w = tier_mix(kind, 4)
    got = np.bincount(assign_tiers(40_000, w, rng()), minlength=4) / 40_000
    assert got == pytest.approx(w, abs=0.01)


def test_default_slos_loosen_down_the_tiers_and_end_non_interactive():
    s = default_slos(4)
    assert (s[0].ttft_s, s[0].tbt_s) == (0.5, 0.05)
    assert s[0].ttft_s < s[1].ttft_s < s[2].ttft_s and s[0].tbt_s < s[1].tbt_s < s[2].tbt_s
    assert not s[3].interactive and s[3].ttlt_s == 60.0
    assert default_slos(1)[0].interactive


def test_niyama_preset():
    ts = niyama_tier_set()
    assert ts.names == ["Q1", "Q2", "Q3"]
    assert (ts[0].slo.ttft_s, ts[0].slo.tbt_s) == (6.0, 0.05)
    assert (ts[1].slo.ttlt_s, ts[2].slo.ttlt_s) == (600.0, 1800.0) and not ts[1].slo.interactive
