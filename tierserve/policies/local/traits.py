"""What a local policy promises, computed once from its class (and its instance's own overrides).

The simulator's executor (tierserve/sim/) reads one `PolicyTraits` per replica instead of inferring the promises
in several places; the engine driver can read the same object. The promises (each documented on `LocalPolicy`):

  steady               the policy's plans keep their own promises: `BatchPlan.repeatable` and the three below
                       are honoured only when this holds (see `steady_plans` for the rule);
  keeps_decode_batch   `decode_batch` names its all-decode batch (a decode run starts without a plan);
  repeats_chunk        `repeats_prefill_chunk` (a prefill's next chunk beside the same decodes, without a plan);
  admission_cap        `admits_waiting` (None: no promise; else the per-request chunk cap, 0 = none);
  hooks                the hooks (`on_*`) the policy defines, on its class or its instance;
  hold rule            which allocation rule `blocks_to_hold` is (per chunk, whole prompt, max length, its own);
  fixed_waiting_key    the key `order_waiting` sorts by where it moves only with the request's own progress.

Why `steady` exists: a subclass inherits its parent's `plan`, which marks a decode-only plan `repeatable` and
answers `decode_batch` / `admits_waiting` on the assumption that the methods it calls (`order_waiting`,
`running_order`, a key, …) are its own. A subclass that redefines one of them — say, an order that depends on
the clock — silently breaks those promises, and skip-ahead with them. So a promise holds only when every class
above the one that defines `plan` (or that declares itself with `declares_steady_plans`) defines no behaviour
of its own; a class that does must say, with `@declares_steady_plans`, that its methods keep the promises.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tierserve.core import RequestState
from tierserve.policies.local.base import (HOOK_NAMES, LocalPolicy, _hold_max_length, _hold_per_chunk,
                                           _hold_whole_prompt)

# Class attributes that declare, not behave: redefining them keeps the parent's plans what they were.
DECLARATIONS = frozenset({
    "name", "default_token_budget", "default_max_num_seqs", "allocation", "preempt_modes", "uses_watermark",
    "needs_oracle", "follows_engine_defaults", "max_model_len", "waiting_order_key", "blocks_to_hold",
    "steady_plans_of",
})

HOLD_RULES = {_hold_per_chunk: "per_chunk", _hold_whole_prompt: "whole_prompt", _hold_max_length: "max_length"}


def _behaviour(namespace: dict[str, Any]) -> list[str]:
    """The names in a class's (or an instance's) namespace that change what the policy does."""
    names = []
    for name, value in namespace.items():
        if name in DECLARATIONS or (name.startswith("__") and name.endswith("__")):
            continue
        if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
            names.append(name)
    return names


def steady_plans(policy: LocalPolicy) -> tuple[bool, str]:
    """(do the policy's plans keep their promises?, why not). The owner of the promises is the nearest class
    that defines `plan` or declares its steady plans (`declares_steady_plans`). Nothing above the owner may
    define behaviour: not a subclass between it and the owner, not the instance (a method other than `plan`
    replaced on it)."""
    own = getattr(policy, "__dict__", {})
    # Methods replaced on the instance; a replaced `plan` makes its own promises (it may wrap the class's, so
    # the class must keep its promises too), any other replaced method withdraws them.
    replaced = [n for n in _behaviour(own) if hasattr(type(policy), n) and n != "plan"]
    if replaced:
        return False, f"the instance replaces {', '.join(sorted(replaced))}"
    for cls in type(policy).__mro__:
        if "plan" in cls.__dict__ or "steady_plans_of" in cls.__dict__:
            return True, ""
        defined = _behaviour(dict(cls.__dict__))
        if defined:
            return False, (f"{cls.__name__} defines {', '.join(sorted(defined))} under an inherited plan without "
                           f"declaring that its plans keep the promises (@declares_steady_plans)")
    return True, ""


def defined_hooks(policy: LocalPolicy) -> frozenset[str]:
    """The hooks the policy defines (class or instance): a hook that may read the replica's state."""
    own = getattr(policy, "__dict__", {})
    return frozenset(h for h in HOOK_NAMES
                     if h in own or getattr(type(policy), h) is not getattr(LocalPolicy, h))


@dataclass(frozen=True)
class PolicyTraits:
    """One policy instance's promises (module docstring)."""

    steady: bool
    why_not_steady: str
    keeps_decode_batch: bool
    repeats_chunk: bool
    admission_cap: int | None
    hooks: frozenset[str]
    hold_rule: str                          # per_chunk | whole_prompt | max_length | own
    fixed_waiting_key: Callable[[RequestState], Any] | None

    @property
    def iteration_hook(self) -> bool:
        return "on_iteration_end" in self.hooks

    @property
    def decode_hold_inline(self) -> bool:
        """A decode step's blocks are ceil((computed + 1) / block_size): computed inline by the hot loops."""
        return self.hold_rule in ("per_chunk", "whole_prompt")


def traits_of(policy: LocalPolicy) -> PolicyTraits:
    """The promises of `policy` as they are now (compute once, when a replica or an engine takes the policy)."""
    steady, why = steady_plans(policy)
    cls = type(policy)
    hooks = defined_hooks(policy)
    hold_rule = HOLD_RULES.get(cls.blocks_to_hold, "own") if "blocks_to_hold" not in policy.__dict__ else "own"
    inline = hold_rule in ("per_chunk", "whole_prompt")
    iteration_hook = "on_iteration_end" in hooks
    # A decode run started from `decode_batch` times its blocks inline; an iteration hook is called at every
    # iteration's end either way, so it does not bar decode runs started without a plan (it does bar the rest).
    keeps = (steady and inline and cls.decode_batch is not LocalPolicy.decode_batch
             and policy.decode_batch([]) is not None)
    repeats = steady and not iteration_hook and policy.repeats_prefill_chunk()
    cap = policy.admits_waiting() if keeps and not iteration_hook else None
    return PolicyTraits(steady=steady, why_not_steady=why, keeps_decode_batch=keeps, repeats_chunk=repeats,
                        admission_cap=cap, hooks=hooks, hold_rule=hold_rule,
                        fixed_waiting_key=_fixed_waiting_key(policy, steady, hooks, cap))


def _fixed_waiting_key(policy: LocalPolicy, steady: bool, hooks: frozenset[str],
                       cap: int | None) -> Callable[[RequestState], Any] | None:
    """The declared `waiting_order_key`, where an engine may keep the waiting order between plans: the plan
    admits a prefix of `order_waiting` (the `admits_waiting` promise), no hook could change a state behind the
    engine's back, and the key is declared by the class that defines `order_waiting` or below it (a subclass
    that overrides `order_waiting` without redeclaring the key has not promised it)."""
    key = getattr(policy, "waiting_order_key", None)
    if key is None or not steady or hooks or cap is None or "order_waiting" in policy.__dict__:
        return None
    mro = type(policy).__mro__
    owner = mro.index(next(c for c in mro if "order_waiting" in c.__dict__))
    if not any("waiting_order_key" in c.__dict__ for c in mro[:owner + 1]):
        return None
    return key


__all__ = ["PolicyTraits", "steady_plans", "traits_of"]
