"""How the tierserve scheduler is configured inside vLLM: `--additional-config '{"tierserve": {...}}'`, or
`TIERSERVE_*` environment variables (read in the engine-core process, which inherits the server's
environment). The additional config wins key by key."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from tierserve.core import ConfigError

ENV = {"policy": "TIERSERVE_POLICY", "policy_params": "TIERSERVE_POLICY_PARAMS",
       "iteration_log": "TIERSERVE_ITERATION_LOG", "decision_log": "TIERSERVE_DECISION_LOG",
       "request_log": "TIERSERVE_REQUEST_LOG", "exec_model_file": "TIERSERVE_EXEC_MODEL_FILE",
       "watermark_fraction": "TIERSERVE_WATERMARK_FRACTION", "incremental_waiting": "TIERSERVE_INCREMENTAL_WAITING"}
BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass(frozen=True)
class EngineSettings:
    policy: str = "vllm"
    """Replica policy: a name from `tierserve policies`, or `module:Class` of a LocalPolicy subclass."""
    policy_params: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the policy (the scenario's `local_policy_params`)."""
    iteration_log: str | None = None
    """CSV path: one row per engine step, the format `tierserve calibrate --iterations` reads (None: off)."""
    decision_log: str | None = None
    """JSON-lines path: the policy's decision and the engine's batch at every step (None: off)."""
    request_log: str | None = None
    """JSON-lines path: one line per request leaving the engine — tier, extra_args, vLLM's arrival stamp (set by
    the API server), entry into this scheduler, first scheduled step, first token, finish (epoch s) and every
    gap between tokens (ms): latencies as the engine saw them (None: off)."""
    exec_model_file: str | None = None
    """Linear fit from `tierserve calibrate --iterations` (this engine's own log): the predictor policies
    may ask (dynamic chunking). None: a policy that asks is refused at its first question."""
    watermark_fraction: float = 0.01
    """KV blocks kept free on admission, for policies declaring `uses_watermark` (the simulator's default)."""
    incremental_waiting: bool = True
    """Keep the waiting queue's policy order between steps where the policy's key allows it (`driver.py`,
    `fixed_waiting_key`); false: re-read and re-sort the whole waiting queue every step (the reference path,
    same decisions, O(waiting) per step)."""

    @classmethod
    def from_sources(cls, additional_config: Mapping[str, Any] | None = None,
                     environ: Mapping[str, str] | None = None) -> "EngineSettings":
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for key, var in ENV.items():
            raw = env.get(var)
            if raw:
                values[key] = _parse_env(key, var, raw)
        extra = (additional_config or {}).get("tierserve") or {}
        if not isinstance(extra, Mapping):
            raise ConfigError("additional_config.tierserve", extra, "a mapping of tierserve settings")
        for key, v in extra.items():
            if key not in ENV:
                raise ConfigError(f"additional_config.tierserve.{key}", v, ", ".join(ENV))
            values[key] = v
        s = cls(**values)
        s.check()
        return s

    def check(self) -> None:
        if not isinstance(self.policy, str) or not self.policy:
            raise ConfigError("tierserve.policy", self.policy, "a policy name or module:Class")
        if not isinstance(self.policy_params, Mapping):
            raise ConfigError("tierserve.policy_params", self.policy_params, "a mapping of keyword arguments")
        if not (isinstance(self.watermark_fraction, (int, float)) and 0 <= self.watermark_fraction < 1):
            raise ConfigError("tierserve.watermark_fraction", self.watermark_fraction, "a fraction in [0, 1)")
        if not isinstance(self.incremental_waiting, bool):
            raise ConfigError("tierserve.incremental_waiting", self.incremental_waiting, "true or false")


def _parse_env(key: str, var: str, raw: str) -> Any:
    if key == "policy_params":
        try:
            return json.loads(raw)
        except ValueError:
            raise ConfigError(var, raw, "a JSON object of policy parameters") from None
    if key == "incremental_waiting":
        if raw.strip().lower() not in BOOLEANS:
            raise ConfigError(var, raw, " | ".join(BOOLEANS))
        return BOOLEANS[raw.strip().lower()]
    if key == "watermark_fraction":
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(var, raw, "a fraction in [0, 1)") from None
    return raw
