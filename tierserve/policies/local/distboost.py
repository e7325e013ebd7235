"""`distboost` (seed 001, phase 1, the strawman): γ-Boost with prefill and decode as disjoint queues — decodes
first, by Φ = a − b_γ(τ·w̃), and prefill chunks piggybacking on the rest of the budget, by the same score of
their known prompt. The rest of the family (`uniboost_base`, `uniboost_memguard`, `uniboost`) is in
`uniboost.py`; any phase can be added here with `phases`."""
from __future__ import annotations

from tierserve.policies.local.uniboost import UniBoostPolicy


class DistBoostPolicy(UniBoostPolicy):
    name = "distboost"
    default_phases: tuple[str, ...] = ()
