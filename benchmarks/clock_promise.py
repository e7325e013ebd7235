"""A subclass of a shipped policy whose waiting order moves with the clock: does skip-ahead stay exact?

    python benchmarks/clock_promise.py [--requests 400]
    PYTHONPATH=/path/to/other/tree python benchmarks/clock_promise.py     # the same check on another tree

The subclass (`ClockOrderedLlumlet`) puts requests waiting over 0.3 s first, reading the time of llumlet's last
plan, under llumlet's own `plan`. The run: 2 replicas, jsq, 400 KV blocks each, Poisson 30 req/s, 3 tiers, the
tests' linear execution model. Printed: how many requests differ between skip-ahead and stepping (every plan
asked for, none repeated). Exact: 0. `tests/test_sim_promises.py` holds the same subclass to account.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


class _Late:
    """Built on first use: the subclass needs tierserve imported from the tree under test."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    args = ap.parse_args(argv)
    import tierserve
    from tierserve import _native
    tree = Path(tierserve.__file__).resolve().parent.parent
    sys.path.insert(0, str(tree / "tests"))
    from conftest import LinearPredictor, make_requests, register_stepwise
    from test_sim_executor import per_request
    from tierserve.policies.local import LOCAL_POLICIES
    from tierserve.policies.local.llumlet import LlumletPolicy
    from tierserve.sim import ClusterConfig, simulate

    class ClockOrderedLlumlet(LlumletPolicy):
        def order_waiting(self, waiting):
            now = self._now
            return sorted(waiting, key=lambda s: (now - s.arrival_s < 0.3, s.tier, s.arrival_s, s.id))

    _Late.ClockOrderedLlumlet = ClockOrderedLlumlet
    LOCAL_POLICIES.table["clock_ordered"] = f"{__name__}:_Late.ClockOrderedLlumlet"
    LOCAL_POLICIES.get_class = _get_class(LOCAL_POLICIES.get_class)
    register_stepwise()
    reqs = make_requests(args.requests, rate=30.0, num_tiers=3, prompt=(20, 900), output=(1, 200))
    cfg = dict(num_replicas=2, cluster_policy="jsq", replica={"num_blocks": 400})
    skipped = simulate(ClusterConfig(local_policy="clock_ordered", **cfg), reqs, 3, predictor=LinearPredictor())
    stepped = simulate(ClusterConfig(local_policy="stepwise", local_policy_params={"inner": "clock_ordered"}, **cfg),
                       reqs, 3, predictor=LinearPredictor())
    differ = sum(a != b for a, b in zip(per_request(skipped), per_request(stepped)))
    print(f"tree {tree} ({_native.REASON}): {differ} of {len(reqs)} requests differ between skip-ahead and stepping")
    return 0


def _get_class(original):
    def get_class(name: str) -> type:
        if name == "clock_ordered":
            return _Late.ClockOrderedLlumlet
        return original(name)
    return get_class


if __name__ == "__main__":
    sys.exit(main())
