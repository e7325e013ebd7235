"""Shared fixtures: a simple linear execution-time model and small request streams."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from tierserve import _native
from tierserve.core import Request


REPO_ROOT = Path(__file__).resolve().parents[1]


def load_script(relative_path: str, module_name: str):
    """A file of the repository that is not in a package (a benchmark, a script), imported as `module_name`."""
    spec = importlib.util.spec_from_file_location(module_name, REPO_ROOT / relative_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_collection_modifyitems(config, items):
    """With the compiled hot path in use, tests that patch its classes run in a pure-Python process instead."""
    if not _native.NATIVE_IN_USE:
        return
    skip = pytest.mark.skip(reason="patches compiled classes: tests/test_native.py runs it with TIERSERVE_PURE_PYTHON=1")
    for item in items:
        if item.get_closest_marker("pure_python") is not None:
            item.add_marker(skip)


class LinearPredictor:
    """t = 5 ms + 0.05 ms/token + 1e-5 ms per attention pair + 2e-5 ms per decode-context token."""

    decode_context_coef_s = 2e-8

    def iteration_time(self, prefill_tokens, prefill_attn_pairs, decode_count, decode_context_sum):
        return (0.005 + 5e-5 * (prefill_tokens + decode_count) + 1e-8 * prefill_attn_pairs
                + self.decode_context_coef_s * decode_context_sum)

    def decode_base_time(self, decode_count):
        return 0.005 + 5e-5 * decode_count

    def max_prefill_tokens_within(self, slack_s, decode_count, decode_context_sum, prefill_context=0, lo=0,
                                  hi=8192):
        """Largest chunk p in [lo, hi] whose iteration fits in `slack_s` (`lo` when none above it does), as the
        IterationPredictor protocol of tierserve.policies.local.view asks; bisection, time grows with p."""
        def fits(p):
            return self.iteration_time(p, p * (prefill_context + p * 0.5), decode_count, decode_context_sum) <= slack_s

        if hi <= lo or not fits(lo + 1):
            return lo
        good, bad = lo + 1, hi + 1          # fits(good) holds; bad is the first known not to (hi + 1 by fiat)
        while bad - good > 1:
            mid = (good + bad) // 2
            if fits(mid):
                good = mid
            else:
                bad = mid
        return good


@pytest.fixture
def predictor():
    return LinearPredictor()


def make_requests(n: int, rate: float, seed: int = 1, num_tiers: int = 1, prompt=(20, 600), output=(1, 300)):
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(Request(i, t, rng.randint(*prompt), rng.randint(*output), tier=rng.randrange(num_tiers)))
    return out


@pytest.fixture
def requests_small():
    return make_requests(300, rate=20.0, num_tiers=3)


class Stepwise:
    """Wraps a registered local policy and marks every plan non-repeatable, so each decode goes through
    the executor's single-iteration path (the reference that skip-ahead must reproduce exactly)."""

    def __new__(cls, inner: str = "vllm", **params):
        from tierserve.policies.local import LOCAL_POLICIES
        policy = LOCAL_POLICIES.create(inner, **params)
        plan = policy.plan

        def plan_one_step(view):
            p = plan(view)
            p.repeatable = False
            return p

        policy.plan = plan_one_step     # an instance attribute: hooks and declarations stay the inner's
        return policy


def register_stepwise():
    """Make `stepwise` (inner policy name in local_policy_params['inner']) a local policy for this session."""
    from tierserve.policies.local import LOCAL_POLICIES
    LOCAL_POLICIES.table["stepwise"] = "conftest:Stepwise"
