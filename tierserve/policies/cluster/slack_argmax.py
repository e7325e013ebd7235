# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""The loop of `deadline_slack`'s dispatch: argmax of predicted slack over the instances, with each
instance's last iteration price kept. Compiled with the simulator's hot path (tierserve/_native.py): a dispatch
reads every instance, so on 64 replicas this loop runs 64 times per request.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


class DeadlineLoadView:
    """Base of an instance view whose deadline load `SlackArgmax` reads by a direct call (compiled with it):
    the simulator's `InstanceHandle`. Any other view is read through its `deadline_load` and `predictor`
    attributes, as `deadline_slack`'s docstring defines them."""

    __slots__ = ()

    def deadline_load(self, deadline: float) -> tuple[int, int, int]:
        """(prefill tokens ahead of `deadline`, running decodes, their context tokens)."""
        raise NotImplementedError

    def iteration_predictor(self) -> Any:
        """The instance's execution-time model (its `predictor`)."""
        raise NotImplementedError


class SlackArgmax:
    """argmax_i slack_i, slack_i = D − (now + (ahead_i + P) / c · T_i), T_i = predictor.iteration_time(c,
    c·c/2, B_i, C_i) and (ahead_i, B_i, C_i) = `instances[i].deadline_load(D)` (deadline_slack's docstring);
    ties: fewer outstanding requests, then the lower index — the order of the tuples (−slack_i,
    num_outstanding_i, i), reproduced without building them.

    Kept per instance index: the last (predictor, B, C) priced and its T, reused while unchanged (an
    instance whose running decodes did not change; `iteration_time` is a function of its arguments)."""

    def __init__(self) -> None:
        self._priced_predictor: list[Any] = []
        self._priced_decodes: list[int] = []
        self._priced_context: list[int] = []
        self._priced_s: list[float] = []
        self.pricings = 0                     # iteration_time calls made (the rest reused a kept price)

    def best(self, instances: Sequence[Any], deadline: float, prompt_left: int, chunk_tokens: int,
             own_predictor: Any, now: float) -> int:
        """The chosen index; `own_predictor` (or None: each instance's `predictor`) prices the iterations."""
        views: list[Any] = instances if isinstance(instances, list) else list(instances)
        num_views = len(views)
        deadline_arg: Any = deadline          # boxed once: passed to every instance
        c = chunk_tokens
        c_arg: Any = c
        chunk_pairs: Any = c * c * 0.5
        priced_predictor, priced_decodes = self._priced_predictor, self._priced_decodes
        priced_context, priced_s = self._priced_context, self._priced_s
        if len(priced_s) < num_views:
            grow = num_views - len(priced_s)
            priced_predictor += [None] * grow
            priced_decodes += [-1] * grow
            priced_context += [-1] * grow
            priced_s += [0.0] * grow
        best = 0
        best_neg_slack = math.inf
        chosen = False                        # the key to beat starts as (inf, inf, inf)
        best_outstanding = -1                 # the chosen instance's, read when a tie needs it
        for i in range(num_views):
            inst = views[i]
            if isinstance(inst, DeadlineLoadView):
                ahead, decodes, context = inst.deadline_load(deadline)
                predictor = own_predictor if own_predictor is not None else inst.iteration_predictor()
            else:
                load: tuple[int, int, int] = inst.deadline_load(deadline_arg)
                ahead, decodes, context = load
                predictor = own_predictor if own_predictor is not None else inst.predictor
            per_iteration_s: float
            if (decodes == priced_decodes[i] and context == priced_context[i]
                    and predictor is priced_predictor[i]):
                per_iteration_s = priced_s[i]
            else:
                per_iteration_s = predictor.iteration_time(c_arg, chunk_pairs, decodes, context)
                self.pricings += 1
                priced_predictor[i], priced_decodes[i], priced_context[i] = predictor, decodes, context
                priced_s[i] = per_iteration_s
            neg_slack = -(deadline - (now + (ahead + prompt_left) / c * per_iteration_s))
            # (neg_slack, outstanding, i) < the best key, compared as tuples compare (i is always larger)
            if neg_slack != best_neg_slack:
                if neg_slack < best_neg_slack:
                    best, best_neg_slack, best_outstanding, chosen = i, neg_slack, -1, True
            else:
                outstanding: int = inst.num_outstanding
                if chosen and best_outstanding < 0:
                    best_outstanding = views[best].num_outstanding
                if not chosen or outstanding < best_outstanding:
                    best, best_outstanding, chosen = i, outstanding, True
        return best
