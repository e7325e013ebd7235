"""Which policies the engine driver can run in vLLM v1, and how one is made from a name: `make_policy`, the
refusals at start (`check_policy`, `check_calibration`) and the waiting key the driver may keep between steps
(`fixed_waiting_key`). Reads the policy's class and traits only; nothing here touches an engine request."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from tierserve.core import AllocationRule, ConfigError, PreemptMode, Request, RequestState
from tierserve.policies.local import LOCAL_POLICIES, LocalPolicy
from tierserve.policies.local.traits import traits_of
from tierserve.policies.local.vllm import VLLMPolicy


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> LocalPolicy:
    """A registered policy by name, or
    `module:Class` of a LocalPolicy subclass; checked for vLLM v1."""
    params = dict(params or {})
    if ":" in name:
        module, _, cls_name = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError("tierserve.policy", name, f"a registered name ({', '.join(LOCAL_POLICIES.names)}) "
                                                        f"or an importable module:Class ({exc})") from None
        if not (isinstance(cls, type) and issubclass(cls, LocalPolicy)):
            raise ConfigError("tierserve.policy", name, "a LocalPolicy subclass")
        try:
            policy = cls(**params)
        except TypeError as exc:
            raise ConfigError("tierserve.policy_params", params, f"parameters of {cls.__name__}: {exc}") from None
    else:
        try:
            policy = LOCAL_POLICIES.create(name, **params)
        except ConfigError as exc:
            if exc.field == "local_policy":
                raise ConfigError("tierserve.policy", name, f"{exc.allowed} (or module:Class of a LocalPolicy)") from None
            raise
    check_policy(policy)
    return policy


def check_policy(policy: LocalPolicy) -> None:
    """Refuse, naming the reason, a policy vLLM v1 cannot honour."""
    name = policy.name
    if policy.needs_oracle:
        raise ConfigError("tierserve.policy", name, "a policy without needs_oracle: a real engine never knows a "
                                                    "request's output length (the Oracle exists only in the simulator)")
    if policy.allocation != AllocationRule.PER_CHUNK:
        raise ConfigError("tierserve.policy", name, f"a policy with allocation PER_CHUNK: vLLM v1 allocates KV blocks "
                                                    f"per chunk only, and {name} declares {policy.allocation.name}")
    probe = RequestState(Request(-1, 0.0, 1, 1))
    if PreemptMode.RECOMPUTE not in policy.preempt_modes or policy.preempt_mode(probe) != PreemptMode.RECOMPUTE:
        raise ConfigError("tierserve.policy", name, "a policy that preempts by recompute: vLLM v1 has no swap "
                                                    "(set preempt_mode: recompute)")


def check_calibration(policy: LocalPolicy, exec_model_file: str | None) -> None:
    """Refuse at start, naming the way out, a policy that asks the execution-time predictor (`uses_predictor`)
    where the engine was given no fit of its own iterations: it would fail at its first question, mid-run."""
    if policy.uses_predictor and not exec_model_file:
        raise ConfigError("tierserve.exec_model_file", exec_model_file,
                          f"a fit of this engine's iterations, because {policy.name} asks the execution-time "
                          f"predictor (uses_predictor): run once with iteration_log (a policy that does not ask, "
                          f"e.g. vllm_priority), then `tierserve calibrate --iterations LOG --out fit.json`, and "
                          f"set exec_model_file")


def fixed_waiting_key(policy: LocalPolicy) -> Callable[[RequestState], Any] | None:
    """The key `policy.order_waiting` sorts by, where the driver can keep that order between steps; else None.

    What the policy promises is read from its traits (`tierserve.policies.local.traits`, the one place that
    infers promises, shared with the simulator's executor): a declared `waiting_order_key`, a plan that admits a
    prefix of that order, no hook that could change a state behind the driver's back. The driver adds one need
    of its own: its kept path stands in for vLLM v1's `resumable`, so the policy must use `VLLMPolicy`'s.
    vllm_priority, vllm_priority_sorted and llumlet without promotion: (tier, arrival, id), fixed at entry;
    vllm_edf: (prefill deadline, arrival, id). Policies without a key take the full path.
    """
    if getattr(type(policy), "resumable", None) is not VLLMPolicy.resumable or "resumable" in policy.__dict__:
        return None
    return traits_of(policy).fixed_waiting_key
