"""Multi-turn sessions: conversations whose turns share a growing prefix (issue 28).

A session belongs to one app (and so one tier); the app's system prompt opens every one of its sessions. Turn k's
prompt is the system prompt, then every earlier turn's new input and output, then turn k's new input, so the
session is one token stream and turn k's prompt is a prefix of turn k+1's. Block hashes follow vLLM v1 (chained,
full blocks of `hash_block_tokens`): the blocks wholly inside the system prompt hash alike in every session of the
app, the rest are the session's own.

Open loop, as every tierserve workload: turn k+1 arrives `think time` after turn k *arrived* (the simulator does
not feed completions back), so the think time has to cover turn k's response as well as the user's pause; the
default mean (30 s) is chosen so. A session ends at its drawn turn count, or earlier, before the first turn
whose prompt + output would exceed `max_context_tokens` (counted in `num_sessions_ended_by_context`; chat
front-ends start a new conversation there). Deterministic per seed.

Defaults are stated assumptions for a chat service, not fits to a trace: sessions at 1/s, geometric turns with mean
4 (at most 16), new input lognormal mean 200 tokens (CV 1), output lognormal mean 250 (CV 1), one app per tier
with a 1,024-token system prompt.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tierserve.core.errors import ConfigError, config_error_from_validation
from tierserve.core.limits import MAX_TIME_S, MAX_TOKENS, Float, Int
from tierserve.core.request import Request
from tierserve.core.slo import TierSet
from tierserve.workload.readers import chain_block_ids

VLLM_BLOCK_TOKENS = 16           # vLLM v1's default KV block size (GPU); vLLM-CPU needs 32
MAX_TURNS = 10_000


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SessionApp(_Section):
    """An app: its tier, its share of the sessions, and the system prompt all its sessions open with."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    tier: Annotated[Int, Field(ge=0)] = 0
    weight: Annotated[Float, Field(ge=0, le=1e12, allow_inf_nan=False)] = 1.0
    system_prompt_tokens: Annotated[Int, Field(ge=0, le=MAX_TOKENS)] = 1024


class SessionsConfig(_Section):
    """The named parameters of the multi-turn generator (`workload.sessions` in YAML)."""

    session_rate: Annotated[Float, Field(gt=0, le=1e9, allow_inf_nan=False)] = Field(
        1.0, description="new sessions per second (Poisson)")
    num_sessions: Annotated[Int, Field(ge=1, le=10**8)] | None = Field(
        None, description="sessions to generate when workload.num_requests is null")
    turns: Literal["geometric", "fixed"] = Field("geometric", description="turns-per-session distribution")
    mean_turns: Annotated[Float, Field(ge=1, le=MAX_TURNS, allow_inf_nan=False)] = 4.0
    max_turns: Annotated[Int, Field(ge=1, le=MAX_TURNS)] = 16
    think_time_mean_s: Annotated[Float, Field(gt=0, le=1e6, allow_inf_nan=False)] = Field(
        30.0, description="mean gap between a turn's arrival and the next's (covers the response too)")
    think_time_min_s: Annotated[Float, Field(ge=0, le=1e6, allow_inf_nan=False)] = Field(
        2.0, description="gaps are min + exponential(mean - min)")
    input_tokens_mean: Annotated[Float, Field(ge=1, le=MAX_TOKENS, allow_inf_nan=False)] = 200.0
    input_tokens_cv: Annotated[Float, Field(ge=0, le=100, allow_inf_nan=False)] = 1.0
    output_tokens_mean: Annotated[Float, Field(ge=1, le=MAX_TOKENS, allow_inf_nan=False)] = 250.0
    output_tokens_cv: Annotated[Float, Field(ge=0, le=100, allow_inf_nan=False)] = 1.0
    max_context_tokens: Annotated[Int, Field(ge=2, le=MAX_TOKENS)] = Field(
        8192, description="a session ends before a turn whose prompt + output exceeds this")
    hash_block_tokens: Annotated[Int, Field(ge=1, le=MAX_TOKENS)] = Field(
        VLLM_BLOCK_TOKENS, description="prefix-hash block size (vLLM: 16; vLLM-CPU: 32)")
    apps: list[SessionApp] | None = Field(
        None, min_length=1, max_length=1000,
        description="default: one app per tier, weighted by the tier mix, 1,024-token system prompts")

    @model_validator(mode="after")
    def _consistent(self) -> SessionsConfig:
        if self.turns == "fixed" and self.mean_turns != int(self.mean_turns):
            raise ValueError(f"mean_turns: got {self.mean_turns}; allowed: an integer when turns = 'fixed'")
        if self.mean_turns > self.max_turns:
            raise ValueError(f"mean_turns: got {self.mean_turns}; allowed: at most max_turns = {self.max_turns}")
        if self.think_time_min_s >= self.think_time_mean_s:
            raise ValueError(f"think_time_min_s: got {self.think_time_min_s}; allowed: below think_time_mean_s "
                             f"= {self.think_time_mean_s}")
        if self.apps is not None:
            if sum(a.weight for a in self.apps) <= 0:
                raise ValueError("apps: got weights summing to 0; allowed: at least one weight > 0")
            names = [a.name for a in self.apps]
            if len(set(names)) != len(names):
                raise ValueError(f"apps: got names {names}; allowed: distinct names")
            for a in self.apps:
                if a.system_prompt_tokens + 2 > self.max_context_tokens:
                    raise ValueError(f"apps: app {a.name!r} has system_prompt_tokens = {a.system_prompt_tokens}; "
                                     f"allowed: at most max_context_tokens - 2 = {self.max_context_tokens - 2}")
        return self

    @classmethod
    def from_dict(cls, data: dict) -> SessionsConfig:
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise config_error_from_validation(e, "sessions") from None


def default_apps(mix_weights: Sequence[float], system_prompt_tokens: int = 1024) -> list[SessionApp]:
    """One app per tier, named `tier<k>`, weighted by the tier mix."""
    return [SessionApp(name=f"tier{k}", tier=k, weight=float(w), system_prompt_tokens=system_prompt_tokens)
            for k, w in enumerate(mix_weights)]


@dataclass(frozen=True, slots=True)
class SessionWorkload:
    """Generated turns (sorted by arrival, ids 0..n-1) and what shaped them, every count reported."""

    requests: list[Request]
    tier_set: TierSet
    num_sessions: int = 0                  # sessions with at least one turn in `requests`
    num_sessions_ended_by_context: int = 0  # ended before a turn that would overflow max_context_tokens
    num_clipped: int = 0                   # first turns whose input/output were cut to fit the context
    num_clamped: int = 0                   # (no trace outputs here; kept so it reads as a Workload)


@dataclass(frozen=True, slots=True)
class _Turn:
    arrival_s: float
    session: int
    turn: int
    prompt_tokens: int
    output_tokens: int
    hashes: tuple[int, ...]
    tier: int
    app: str


def _lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    """Integer token counts >= 1, lognormal with the given mean and CV (CV 0: the mean itself)."""
    if cv == 0:
        return np.full(n, max(1, round(mean)), np.int64)
    sigma2 = math.log1p(cv * cv)
    x = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n)
    return np.clip(np.rint(x), 1, MAX_TOKENS).astype(np.int64)


def _num_turns(cfg: SessionsConfig, rng: np.random.Generator) -> int:
    if cfg.turns == "fixed":
        return int(cfg.mean_turns)
    # geometric on 1, 2, ... with the asked mean, then capped (the cap lowers the mean a little: documented)
    return int(min(rng.geometric(1.0 / cfg.mean_turns), cfg.max_turns))


class _SessionMaker:
    """Draws one session at a time, in start order, from one random stream."""

    def __init__(self, cfg: SessionsConfig, apps: list[SessionApp], tier_set: TierSet, seed: int) -> None:
        for i, a in enumerate(apps):
            tier_set.check_tier(a.tier, f"sessions.apps[{i}].tier")
        self.cfg, self.apps = cfg, apps
        self.rng = np.random.default_rng(np.random.SeedSequence(seed))
        w = np.asarray([a.weight for a in apps], np.float64)
        self.app_p = w / w.sum()
        b = cfg.hash_block_tokens
        # the system prompt's full blocks hash alike in every session of the app: content ids < 0, one per app
        self.system_hashes = [chain_block_ids(-(i << 32) - j - 1 for j in range(a.system_prompt_tokens // b))
                              for i, a in enumerate(apps)]
        self.start_s = 0.0
        self.index = 0
        self.ended_by_context = 0
        self.clipped = 0

    def next_session(self) -> list[_Turn]:
        cfg, rng = self.cfg, self.rng
        s = self.index
        self.index += 1
        self.start_s += float(rng.exponential(1.0 / cfg.session_rate))
        a = int(rng.choice(len(self.apps), p=self.app_p))
        app = self.apps[a]
        k = _num_turns(cfg, rng)
        inputs = _lognormal(rng, cfg.input_tokens_mean, cfg.input_tokens_cv, k).tolist()
        outputs = _lognormal(rng, cfg.output_tokens_mean, cfg.output_tokens_cv, k).tolist()
        gaps = (cfg.think_time_min_s + rng.exponential(cfg.think_time_mean_s - cfg.think_time_min_s, k)).tolist()
        ctx, sys_tokens = cfg.max_context_tokens, app.system_prompt_tokens
        room = ctx - sys_tokens
        if inputs[0] + outputs[0] > room:        # the first turn is cut to fit, never dropped (counted)
            self.clipped += 1
            outputs[0] = min(outputs[0], room - 1)
            inputs[0] = room - outputs[0]
        prompts, arrivals = [], []
        context, t = sys_tokens, self.start_s
        for j in range(k):
            if context + inputs[j] + outputs[j] > ctx:
                self.ended_by_context += 1
                break
            prompts.append(context + inputs[j])
            arrivals.append(t)
            context += inputs[j] + outputs[j]
            t += gaps[j]
        if arrivals[-1] > MAX_TIME_S:
            raise ConfigError("sessions.session_rate", cfg.session_rate,
                              f"turns within {MAX_TIME_S:g} s; session {s} would reach {arrivals[-1]:.4g} s")
        b = cfg.hash_block_tokens
        sys_h = self.system_hashes[a]
        own_blocks = prompts[-1] // b - len(sys_h)      # the session's blocks up to its last prompt
        stream = sys_h + chain_block_ids(((s << 32) + j for j in range(own_blocks)),
                                         sys_h[-1] if sys_h else 0)
        return [_Turn(arrivals[j], s, j, prompts[j], outputs[j], stream[:prompts[j] // b], app.tier, app.name)
                for j in range(len(prompts))]


def generate_sessions(cfg: SessionsConfig, tier_set: TierSet, seed: int, num_requests: int | None,
                      apps: list[SessionApp] | None = None) -> SessionWorkload:
    """The first `num_requests` turns in arrival order (all turns of `cfg.num_sessions` sessions when None).

    Sessions start in order, so once `num_requests` turns are held, a session starting after the n-th earliest of
    them cannot contribute: generation stops there, and the result is exactly the first n arrivals."""
    if num_requests is None and cfg.num_sessions is None:
        raise ConfigError("sessions.num_sessions", None, "a number of sessions when workload.num_requests is null")
    apps = apps if apps is not None else cfg.apps
    if apps is None:
        raise ConfigError("sessions.apps", None, "a list of apps (or let the workload derive one per tier)")
    maker = _SessionMaker(cfg, apps, tier_set, seed)
    turns: list[_Turn] = []
    if num_requests is None:
        for _ in range(cfg.num_sessions):  # type: ignore[arg-type]
            turns += maker.next_session()
    else:
        latest: list[float] = []          # max-heap (negated) of the n earliest arrivals so far
        while len(latest) < num_requests or maker.start_s <= -latest[0]:
            for tn in maker.next_session():
                turns.append(tn)
                if len(latest) < num_requests:
                    heapq.heappush(latest, -tn.arrival_s)
                elif tn.arrival_s < -latest[0]:
                    heapq.heapreplace(latest, -tn.arrival_s)
    turns.sort(key=lambda tn: (tn.arrival_s, tn.session, tn.turn))
    if num_requests is not None:
        turns = turns[:num_requests]
    b = cfg.hash_block_tokens
    reqs = [Request(id=i, arrival_s=tn.arrival_s, prompt_tokens=tn.prompt_tokens, output_tokens=tn.output_tokens,
                    tier=tn.tier, slo=tier_set[tn.tier].slo, app=tn.app, prefix_hashes=tn.hashes,
                    hash_block_tokens=b, session_id=tn.session) for i, tn in enumerate(turns)]
    return SessionWorkload(reqs, tier_set, len({tn.session for tn in turns}), maker.ended_by_context,
                           maker.clipped)


@dataclass(frozen=True, slots=True)
class ReuseBound:
    """What an unlimited prefix cache could hit, requests taken in arrival order (the trace's own bound)."""

    num_requests: int
    blocks: int              # full hash blocks over all prompts
    blocks_seen: int         # of them, blocks some earlier request already had (the "seen before")
    prompt_tokens: int
    cacheable_tokens: int    # tokens vLLM v1 could skip: seen blocks, capped to leave the prompt's last token

    @property
    def block_fraction(self) -> float:
        return self.blocks_seen / self.blocks if self.blocks else 0.0

    @property
    def token_fraction(self) -> float:
        return self.cacheable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prefix_reuse_bound(requests: Sequence[Request]) -> ReuseBound:
    """The reuse bound of `requests` (sorted by arrival): with chained hashes a seen block implies its whole prefix
    was seen, so a request's hit is its longest run of already-seen leading blocks. A fully seen prompt still
    computes its last token (vLLM v1 rule), so cacheable tokens stop one block short there."""
    seen: set[int] = set()
    blocks = blocks_seen = tokens = cacheable = 0
    for r in requests:
        hashes = r.prefix_hashes
        hit = 0
        for h in hashes:
            if h not in seen:
                break
            hit += 1
        blocks += len(hashes)
        blocks_seen += hit
        tokens += r.prompt_tokens
        if hashes:
            cacheable += min(hit, (r.prompt_tokens - 1) // r.hash_block_tokens) * r.hash_block_tokens
        seen.update(hashes[hit:])
    return ReuseBound(len(requests), blocks, blocks_seen, tokens, cacheable)
