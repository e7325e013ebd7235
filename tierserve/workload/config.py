"""Workload configuration (pydantic v2, unknown fields rejected) and `build_requests`.

Sections: `arrivals` (kind: poisson | gamma | piecewise | diurnal | servegen | trace), `lengths` (kind: fit |
empirical | choice | trace), `tiers` (K, mix, SLOs or the Niyama preset), optional `trace` (path + format),
`num_requests`, `seed`; or `sessions` (multi-turn conversations, `tierserve.workload.sessions`) in place of
arrivals and lengths. Arrivals, lengths and tiers draw from independent child streams of `seed`, so
changing one section leaves the others' draws unchanged.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from tierserve.core import limits
from tierserve.core.errors import ConfigError, config_error_from_validation
from tierserve.core.files import read_mapping
from tierserve.core.gc_tuning import collect_less_often
from tierserve.core.limits import MAX_TIME_S, MAX_TOKENS, Float, Int
from tierserve.core.request import Request
from tierserve.core.slo import SLO, Tier, TierSet
from tierserve.workload import arrivals as arr
from tierserve.workload import lengths as ln
from tierserve.workload import tiers as tr
from tierserve.workload.readers import ReadResult, TraceRow, read_rows
from tierserve.workload.sessions import SessionsConfig, SessionWorkload, default_apps, generate_sessions

# Numbers are written as numbers (`true` and "12" are refused: `Int`/`Float`), finite, and bounded so that no
# product or sum of them overflows; times stay within MAX_TIME_S (see tierserve.core.limits).
PosFloat = Annotated[Float, Field(gt=0, allow_inf_nan=False)]
MAX_RATE = 1e12                                                     # req/s
Rate = Annotated[Float, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)]
Seconds = Annotated[Float, Field(gt=0, le=MAX_TIME_S, allow_inf_nan=False)]
CV = Annotated[Float, Field(ge=1e-3, le=100, allow_inf_nan=False)]
Weight = Annotated[Float, Field(ge=0, le=1e12, allow_inf_nan=False)]
Tokens = Annotated[Int, Field(ge=1, le=MAX_TOKENS)]
Seed = Annotated[Int, Field(ge=0, le=2**63 - 1)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- arrivals ----------------------------------------------------------------------------------------------

class PoissonConfig(_Section):
    kind: Literal["poisson"] = "poisson"
    rate: Rate = Field(description="mean arrival rate, requests/s")


class GammaConfig(_Section):
    kind: Literal["gamma"] = "gamma"
    rate: Rate = Field(description="mean arrival rate, requests/s")
    cv: CV = Field(description="inter-arrival coefficient of variation (1 = Poisson)")


class PiecewiseConfig(_Section):
    kind: Literal["piecewise"] = "piecewise"
    rates: list[Annotated[Float, Field(ge=0, le=MAX_RATE, allow_inf_nan=False)]] = Field(
        description="rate per segment, req/s")
    durations_s: list[Seconds] = Field(description="segment lengths; the profile repeats periodically")
    cv: CV = Field(1.0, description="CV of the underlying renewal process")
    mean_rate: Rate | None = Field(None, description="rescale the profile to this time-averaged rate")

    @field_validator("rates", "durations_s", mode="before")
    @classmethod
    def _few_segments(cls, v, info: ValidationInfo):
        if isinstance(v, (list, tuple)):
            limits.SEGMENTS.check(info.field_name, len(v), f"a list of {len(v):,} values")
        return v

    @model_validator(mode="after")
    def _same_length(self) -> PiecewiseConfig:
        if len(self.rates) != len(self.durations_s) or not self.rates:
            raise ValueError(f"rates: got {len(self.rates)} values; allowed: a non-empty list as long as "
                             f"durations_s ({len(self.durations_s)})")
        if sum(self.rates) <= 0:
            raise ValueError(f"rates: got {self.rates}; allowed: at least one rate > 0")
        return self


class DiurnalConfig(_Section):
    kind: Literal["diurnal"] = "diurnal"
    mean_rate: Rate
    amplitude: Annotated[Float, Field(ge=0, le=1)] = Field(0.5, description="peak = mean·(1+amplitude)")
    period_s: Seconds = 86400.0
    segments: Annotated[Int, Field(ge=1)] = 48
    cv: CV = 1.0

    @field_validator("segments")
    @classmethod
    def _few_segments(cls, v: int) -> int:
        limits.SEGMENTS.check("segments", v)
        return v


class ServeGenConfig(_Section):
    kind: Literal["servegen"] = "servegen"
    model: Literal["deepseek_r1", "m_large", "m_mid", "m_small"] = "deepseek_r1"
    mean_rate: Rate = Field(description="the series' shape is rescaled to this mean rate")
    period_s: Seconds | None = Field(None, description="compress/stretch the whole series to this length")
    cv: CV = 1.0


class TraceArrivalConfig(_Section):
    kind: Literal["trace"] = "trace"
    target_rate: Rate | None = Field(None, description="rescale trace time to this mean rate")
    tick_s: Seconds | None = Field(None, description="spread quantised timestamps inside ticks (Mooncake: 3)")


ArrivalConfig = Annotated[Union[PoissonConfig, GammaConfig, PiecewiseConfig, DiurnalConfig, ServeGenConfig,
                                TraceArrivalConfig], Field(discriminator="kind")]


# ---- lengths -----------------------------------------------------------------------------------------------

class _LengthBase(_Section):
    max_total_tokens: Annotated[Int, Field(ge=2, le=MAX_TOKENS)] | None = Field(
        None, description="opt-in Vidur clip: cut prompts so prompt+output <= this; count reported")


class FitLengthConfig(_LengthBase):
    kind: Literal["fit"] = "fit"
    dataset: str = Field("azure2023_conv", description="a key of data/length_fits.json")

    @model_validator(mode="after")
    def _known(self) -> FitLengthConfig:
        known = sorted(ln.load_length_fits()["fits"])
        if self.dataset not in known:
            raise ValueError(f"dataset: got {self.dataset!r}; allowed: {' | '.join(known)}")
        return self


class EmpiricalLengthConfig(_LengthBase):
    kind: Literal["empirical"] = "empirical"
    dataset: str | None = Field(None, description="a shared dataset name (see lengths.DATASETS)")
    path: str | None = Field(None, description="a file instead of a dataset name")
    format: Literal["csv", "azure", "mooncake", "vidur", "vidur_run", "lengths"] = "csv"
    replace: bool = Field(True, strict=True, description="sample rows with replacement (False: distinct rows, as Vidur)")

    @model_validator(mode="after")
    def _one_source(self) -> EmpiricalLengthConfig:
        if (self.dataset is None) == (self.path is None):
            raise ValueError(f"dataset/path: got dataset={self.dataset!r}, path={self.path!r}; "
                             "allowed: exactly one of them")
        if self.dataset is not None and self.dataset not in ln.DATASETS:
            raise ValueError(f"dataset: got {self.dataset!r}; allowed: {' | '.join(ln.DATASETS)}")
        return self


class ChoiceOption(_Section):
    prompt: Tokens
    output: Tokens
    weight: Weight = 1.0


class ChoiceLengthConfig(_LengthBase):
    kind: Literal["choice"] = "choice"
    options: list[ChoiceOption] = Field(min_length=1, max_length=10_000)


class TraceLengthConfig(_LengthBase):
    kind: Literal["trace"] = "trace"


LengthConfig = Annotated[Union[FitLengthConfig, EmpiricalLengthConfig, ChoiceLengthConfig, TraceLengthConfig],
                         Field(discriminator="kind")]


# ---- tiers and trace ---------------------------------------------------------------------------------------

class SLOConfig(_Section):
    ttft_s: Seconds | None = None
    tbt_s: Seconds | None = None
    ttlt_s: Seconds | None = None
    attainment: Annotated[Float, Field(gt=0, le=1)] = 0.99

    def to_slo(self) -> SLO:
        return SLO(self.ttft_s, self.tbt_s, self.ttlt_s, self.attainment)


MAX_TIER_NAME = 64
# Keys the summaries and verdicts use beside the tiers' own: a tier of that name would be merged with them.
RESERVED_TIER_NAMES = ("all", "backlog", "work")


def check_tier_name(field: str, name: str, earlier: Sequence[str] = ()) -> None:
    """A tier name is printable text, unique (case-insensitively) and none of RESERVED_TIER_NAMES."""
    if not name.strip() or not name.isprintable() or name != name.strip():
        raise ConfigError(field, name, "printable text without surrounding spaces")
    if name.casefold() in RESERVED_TIER_NAMES:
        raise ConfigError(field, name, f"a name other than {', '.join(RESERVED_TIER_NAMES)} (reserved: the summary "
                                       "uses them for the whole run and its verdicts)")
    if name.casefold() in {e.casefold() for e in earlier}:
        raise ConfigError(field, name, "a name no other tier has (case-insensitively; two tiers of one name "
                                       "would be merged in the summary)")


class TiersConfig(_Section):
    num_tiers: Annotated[Int, Field(ge=1)] = 3
    mix: Literal["uniform", "gaussian", "enterprise", "weights"] | None = Field(
        None, description="default: the preset's mix (niyama: uniform), else enterprise")
    weights: list[Weight] | None = None
    sigma: Annotated[Float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = Field(
        None, description="gaussian mix width in tiers (default K/4)")
    slos: list[SLOConfig] | None = Field(None, description="one per tier; default tiers.default_slos(K)")
    names: list[Annotated[str, Field(min_length=1, max_length=MAX_TIER_NAME)]] | None = None
    preset: Literal["niyama"] | None = Field(None, description="niyama: Q1 TTFT 6 s/TBT 50 ms, Q2 TTLT 600 s, "
                                                               "Q3 TTLT 1800 s, 1/3 each")
    from_trace: bool = Field(True, strict=True, description="use the trace's tier column when it has one")

    @field_validator("num_tiers")
    @classmethod
    def _few_tiers(cls, v: int) -> int:
        limits.TIERS.check("num_tiers", v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TiersConfig:
        k = self.num_tiers
        if self.preset == "niyama" and k != 3:
            raise ValueError(f"num_tiers: got {k}; allowed: 3 with preset 'niyama'")
        if self.preset is not None and self.slos is not None:
            raise ValueError("slos: got a list; allowed: null when a preset sets the SLOs")
        if self.mix == "weights" and self.weights is None:
            raise ValueError("weights: got null; allowed: a list of num_tiers weights when mix = 'weights'")
        if self.weights is not None:
            if self.mix not in (None, "weights"):
                raise ValueError(f"weights: got a list; allowed: only with mix = 'weights' (mix is {self.mix!r})")
            if len(self.weights) != k or sum(self.weights) <= 0:
                raise ValueError(f"weights: got {self.weights}; allowed: {k} weights >= 0 with a positive sum")
        for name, lst in (("slos", self.slos), ("names", self.names)):
            if lst is not None and len(lst) != k:
                raise ValueError(f"{name}: got {len(lst)} entries; allowed: exactly num_tiers = {k}")
        for i, tier in enumerate(self.names or ()):
            check_tier_name(f"names[{i}]", tier, self.names[:i])
        return self

    def mix_weights(self) -> np.ndarray:
        if self.mix is None:
            if self.weights is not None:
                return tr.explicit_mix(self.weights, self.num_tiers)
            if self.preset == "niyama":
                return np.asarray(tr.NIYAMA_MIX)
            return tr.enterprise_mix(self.num_tiers)
        return tr.tier_mix(self.mix, self.num_tiers, self.weights, self.sigma)

    def tier_set(self) -> TierSet:
        if self.preset == "niyama":
            base = tr.niyama_tier_set()
        elif self.slos is not None:
            base = TierSet.default(self.num_tiers, [s.to_slo() for s in self.slos])
        else:
            base = tr.default_tier_set(self.num_tiers)
        if self.names is None:
            return base
        return TierSet([Tier(t.index, self.names[t.index], t.slo) for t in base])


class TraceConfig(_Section):
    path: str
    format: Literal["csv", "azure", "mooncake", "vidur", "vidur_run"] = "csv"
    sort: bool = Field(False, strict=True, description="sort unsorted arrivals (default: error)")
    min_output: Annotated[Int, Field(ge=1, le=MAX_TOKENS)] | None = Field(
        None, description="clamp output 0 up to this (default: output 0 is an error)")


class WorkloadConfig(_Section):
    num_requests: Annotated[Int, Field(ge=1)] | None = Field(
        2000, description="requests to generate; null = every trace row (trace-driven only)")
    seed: Seed = 0
    arrivals: ArrivalConfig = PoissonConfig(rate=12.0)
    lengths: LengthConfig = FitLengthConfig()
    tiers: TiersConfig = TiersConfig()
    trace: TraceConfig | None = None
    sessions: SessionsConfig | None = Field(
        None, description="multi-turn sessions: they draw their own arrivals and lengths (issue 28)")

    @field_validator("num_requests")
    @classmethod
    def _few_requests(cls, v: int | None) -> int | None:
        if v is not None:
            limits.REQUESTS.check("num_requests", v)
        return v

    @model_validator(mode="after")
    def _trace_use(self) -> WorkloadConfig:
        if self.sessions is not None:
            for name in ("arrivals", "lengths", "trace"):      # compared with the defaults: a dump round-trips
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(f"{name}: got a {name} section beside sessions; allowed: none (sessions draw "
                                     "their own arrivals and lengths)")
            if self.num_requests is None and self.sessions.num_sessions is None:
                raise ValueError("num_requests: got null; allowed: null only with sessions.num_sessions set")
            return self
        uses = self.arrivals.kind == "trace" or self.lengths.kind == "trace"
        if uses and self.trace is None:
            raise ValueError("trace: got null; allowed: a {path, format} section when arrivals or lengths "
                             "have kind 'trace'")
        if self.trace is not None and not uses:
            raise ValueError("trace: got a section nobody uses; allowed: only with arrivals.kind or "
                             "lengths.kind = 'trace'")
        if self.num_requests is None and not uses:
            raise ValueError("num_requests: got null; allowed: null only for trace-driven workloads")
        return self

    @classmethod
    def from_dict(cls, data: dict) -> WorkloadConfig:
        """Validate, turning pydantic's errors into one ConfigError naming the field, value and rule."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise config_error_from_validation(e, "workload") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> WorkloadConfig:
        data = read_mapping(path, "workload file", "yaml")
        if "workload" in data and len(data) == 1:
            data = data["workload"]  # accept a file whose top level is `workload:`
        return cls.from_dict(data)


# ---- building --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Workload:
    """Built requests plus what was done to them on request (clip/clamp counts are never silent)."""

    requests: list[Request]
    tier_set: TierSet
    num_clipped: int = 0       # prompts cut by lengths.max_total_tokens
    num_clamped: int = 0       # trace outputs raised from 0 by trace.min_output


def _arrival_process(c, rows: list[TraceRow] | None):
    if isinstance(c, PoissonConfig):
        return arr.PoissonArrivals(c.rate)
    if isinstance(c, GammaConfig):
        return arr.GammaArrivals(c.rate, c.cv)
    if isinstance(c, PiecewiseConfig):
        p = arr.PiecewiseRateArrivals(tuple(c.rates), tuple(c.durations_s), c.cv)
        return p.scaled_to(c.mean_rate) if c.mean_rate is not None else p
    if isinstance(c, DiurnalConfig):
        return arr.diurnal(c.mean_rate, c.amplitude, c.period_s, c.segments, c.cv)
    if isinstance(c, ServeGenConfig):
        return arr.servegen(c.model, c.mean_rate, c.period_s, c.cv)
    assert rows is not None  # the config validator requires a trace for kind 'trace'
    if rows and rows[0].arrival_s is None:
        raise ConfigError("arrivals.kind", "trace", "a trace with arrival times (this file is length-only)")
    return arr.TraceArrivals(tuple(float(r.arrival_s) for r in rows), c.target_rate, c.tick_s)  # type: ignore[arg-type]


def _length_sampler(c, rows: list[TraceRow] | None):
    if isinstance(c, FitLengthConfig):
        return ln.fitted_lengths(c.dataset)
    if isinstance(c, EmpiricalLengthConfig):
        if c.dataset is not None:
            return ln.EmpiricalLengths.from_dataset(c.dataset, c.replace)
        return ln.EmpiricalLengths.from_file(c.path, c.format, c.replace)  # type: ignore[arg-type]
    if isinstance(c, ChoiceLengthConfig):
        return ln.ChoiceLengths(tuple(o.prompt for o in c.options), tuple(o.output for o in c.options),
                                tuple(o.weight for o in c.options))
    return None  # kind 'trace': rows in order


# Requests are generated in blocks of this many (arrival times, lengths, tiers), so a stream of any length holds
# one block. Lengths are drawn per block (a rejection sampler's draws depend on the count asked for), so a run of
# up to STREAM_BLOCK requests draws exactly what one call for all of them would.
STREAM_BLOCK = 1 << 20


class RequestStream:
    """The requests of a workload, generated block by block as they are read: the same `Request`s, in the same
    order, as `build_workload(cfg, seed).requests`, in memory O(STREAM_BLOCK) rather than O(n).

    A forward-only sequence: `len()` is known up front; `stream[i]` may read request i at or after the last one
    read (and that one again), which is how the simulator consumes arrivals. Iterating reads every request once.
    Arrival times are checked for the float-time limit over the whole stream before the first is returned, so a
    bad profile is refused before a run starts. `num_clipped` counts the prompts cut so far (all of them once
    the stream has been read to its end).
    """

    def __init__(self, cfg: WorkloadConfig, seed: int | None = None, block: int = STREAM_BLOCK) -> None:
        s = cfg.seed if seed is None else seed
        self._seeds = np.random.SeedSequence(s).spawn(3)
        self.block = int(block)
        tiers_cfg = cfg.tiers
        self.read: ReadResult | None = None
        if cfg.trace is not None:
            self.read = read_rows(cfg.trace.path, cfg.trace.format, num_tiers=tiers_cfg.num_tiers,
                                  min_output=cfg.trace.min_output, sort=cfg.trace.sort)
        rows = self.read.rows if self.read is not None else None
        n = cfg.num_requests if cfg.num_requests is not None else len(rows)  # type: ignore[arg-type]
        if rows is not None and cfg.lengths.kind == "trace" and n > len(rows):
            raise ConfigError("num_requests", n, f"at most {len(rows)} (rows in {cfg.trace.path})")  # type: ignore[union-attr]
        self.cfg, self.n, self._rows = cfg, int(n), rows
        self.tier_set = tiers_cfg.tier_set()
        self._process = _arrival_process(cfg.arrivals, rows)
        self._check_arrivals()
        self._sampler = _length_sampler(cfg.lengths, rows)
        self._trace_tiers = (rows is not None and tiers_cfg.from_trace and cfg.lengths.kind == "trace"
                             and len(rows) > 0 and rows[0].tier is not None)
        self.num_clipped = 0
        self._blocks = self._generate()
        self._lo = self._hi = 0          # the block held: requests [lo, hi)
        self._cols: tuple = ()
        self._last: Request | None = None

    @property
    def num_clamped(self) -> int:
        return self.read.num_clamped if self.read is not None else 0

    def __len__(self) -> int:
        return self.n

    def _check_arrivals(self) -> None:
        rng = np.random.default_rng(self._seeds[0])
        lo = 0
        for times in arr.sample_blocks(self._process, self.n, rng, self.block):
            if not (np.isfinite(times[-1]) and times[-1] <= MAX_TIME_S):
                i = int(np.argmax(~(np.isfinite(times) & (times <= MAX_TIME_S))))
                raise ConfigError("arrivals", self.cfg.arrivals.kind,
                                  f"arrivals within {MAX_TIME_S:g} s (float time keeps sub-microsecond resolution "
                                  f"only below it); request {lo + i} would arrive at {float(times[i]):.4g} s: raise "
                                  "the rate or shorten the profile")
            lo += len(times)

    def _generate(self):
        """(lo, times, prompts, outputs, tiers, apps) per block."""
        cfg, n, rows, sampler = self.cfg, self.n, self._rows, self._sampler
        rng_arr, rng_len, rng_tier = (np.random.default_rng(c) for c in self._seeds)
        if sampler is None:
            all_p = np.array([r.prompt_tokens for r in rows[:n]], np.int64)  # type: ignore[index]
            all_o = np.array([r.output_tokens for r in rows[:n]], np.int64)  # type: ignore[index]
        elif isinstance(sampler, ln.EmpiricalLengths) and not sampler.replace:
            all_p, all_o = sampler.sample(n, rng_len)      # distinct rows: one draw (n <= the rows held)
        else:
            all_p = all_o = None
        weights = None if self._trace_tiers else self.cfg.tiers.mix_weights()
        lo = 0
        for times in arr.sample_blocks(self._process, n, rng_arr, self.block):
            k = len(times)
            if all_p is not None:
                prompts, outputs = all_p[lo:lo + k], all_o[lo:lo + k]
            else:
                prompts, outputs = sampler.sample(k, rng_len)
            if cfg.lengths.max_total_tokens is not None:
                clip = ln.clip_total_tokens(prompts, outputs, cfg.lengths.max_total_tokens,
                                            cfg.trace.path if cfg.trace and sampler is None else "lengths", lo)
                prompts, outputs = clip.prompts, clip.outputs
                self.num_clipped += clip.num_clipped
            if self._trace_tiers:
                tiers = np.array([r.tier for r in rows[lo:lo + k]], np.int64)  # type: ignore[index]
            else:
                tiers = tr.assign_tiers(k, weights, rng_tier)
            trace_rows = rows[lo:lo + k] if sampler is None and rows is not None else None
            yield lo, times, prompts, outputs, tiers, trace_rows
            lo += k

    def _request(self, i: int) -> Request:
        lo, times, prompts, outputs, tiers, trace_rows = self._cols
        j = i - lo
        t = int(tiers[j])
        if trace_rows is None:
            return Request(id=i, arrival_s=float(times[j]), prompt_tokens=int(prompts[j]),
                           output_tokens=int(outputs[j]), tier=t, slo=self.tier_set[t].slo)
        row = trace_rows[j]
        return Request(id=i, arrival_s=float(times[j]), prompt_tokens=int(prompts[j]),
                       output_tokens=int(outputs[j]), tier=t, slo=self.tier_set[t].slo, app=row.app,
                       prefix_hashes=_full_blocks(row, int(prompts[j])), hash_block_tokens=row.hash_block_tokens,
                       session_id=row.session_id)

    def _block_requests(self, cols: tuple) -> list[Request]:
        """Every request of one generated block, as `_request` makes them one by one (columns read as lists:
        no numpy scalar per field)."""
        lo, times, prompts, outputs, tiers, trace_rows = cols
        tier_list = np.asarray(tiers).astype(np.int64, copy=False).tolist()
        slo_of = {t: self.tier_set[t].slo for t in dict.fromkeys(tier_list)}
        columns = (range(lo, lo + len(times)), np.asarray(times, dtype=np.float64).tolist(),
                   np.asarray(prompts).astype(np.int64, copy=False).tolist(),
                   np.asarray(outputs).astype(np.int64, copy=False).tolist(), tier_list)
        if trace_rows is None:
            return [Request(id=i, arrival_s=t_s, prompt_tokens=p, output_tokens=o, tier=t, slo=slo_of[t])
                    for i, t_s, p, o, t in zip(*columns)]
        return [Request(id=i, arrival_s=t_s, prompt_tokens=p, output_tokens=o, tier=t, slo=slo_of[t], app=r.app,
                        prefix_hashes=_full_blocks(r, p), hash_block_tokens=r.hash_block_tokens,
                        session_id=r.session_id)
                for i, t_s, p, o, t, r in zip(*columns, trace_rows)]

    def __getitem__(self, i: int) -> Request:
        last = self._last
        if last is not None and last.id == i:
            return last
        if not 0 <= i < self.n:
            raise IndexError(f"request {i} of a stream of {self.n}")
        if i < self._lo or (last is not None and i < last.id):
            raise IndexError(f"request {i}: a RequestStream reads forward only (request "
                             f"{last.id if last is not None else self._lo} was read)")
        while i >= self._hi:
            self._cols = next(self._blocks)
            self._lo, self._hi = self._cols[0], self._cols[0] + len(self._cols[1])
        self._last = r = self._request(i)
        return r

    def __iter__(self):
        start = 0 if self._last is None else self._last.id + 1
        for i in range(start, self.n):
            yield self[i]


def _full_blocks(row: TraceRow, prompt_tokens: int) -> tuple[int, ...]:
    """The row's prefix hashes that still lie inside its prompt (a max_total_tokens clip shortens the prompt)."""
    hashes = row.prefix_hashes
    if hashes and len(hashes) * row.hash_block_tokens > prompt_tokens:
        return hashes[:prompt_tokens // row.hash_block_tokens]
    return hashes


def build_sessions(cfg: WorkloadConfig, seed: int | None = None) -> SessionWorkload:
    """The multi-turn workload of `cfg.sessions` (apps default to one per tier, weighted by the tier mix)."""
    assert cfg.sessions is not None
    apps = cfg.sessions.apps or default_apps(cfg.tiers.mix_weights().tolist())
    return generate_sessions(cfg.sessions, cfg.tiers.tier_set(), cfg.seed if seed is None else seed,
                             cfg.num_requests, apps)


def build_workload(cfg: WorkloadConfig, seed: int | None = None) -> Workload:
    """Requests for `cfg` (sorted by arrival, ids 0..n-1), deterministic for a seed (default cfg.seed)."""
    if cfg.sessions is not None:
        sw = build_sessions(cfg, seed)
        return Workload(sw.requests, sw.tier_set, sw.num_clipped, 0)
    stream = RequestStream(cfg, seed)
    reqs = []
    with collect_less_often():          # every request is kept: nothing for the collector to find
        for cols in stream._blocks:
            reqs += stream._block_requests(cols)
    return Workload(reqs, stream.tier_set, stream.num_clipped, stream.num_clamped)


@dataclass(frozen=True, slots=True)
class StreamedWorkload:
    """A workload whose requests are a `RequestStream` (generated as the simulator reads them)."""

    requests: RequestStream
    tier_set: TierSet

    @property
    def num_clipped(self) -> int:
        return self.requests.num_clipped

    @property
    def num_clamped(self) -> int:
        return self.requests.num_clamped


def stream_workload(cfg: WorkloadConfig, seed: int | None = None) -> StreamedWorkload:
    """As `build_workload`, but the requests are generated as they are read (see `RequestStream`); sessions are
    built whole (a turn's prefix needs its session's earlier turns)."""
    if cfg.sessions is not None:
        return build_workload(cfg, seed)  # type: ignore[return-value]
    stream = RequestStream(cfg, seed)
    return StreamedWorkload(stream, stream.tier_set)


def build_requests(cfg: WorkloadConfig, seed: int | None = None) -> list[Request]:
    """`build_workload(cfg, seed).requests`."""
    return build_workload(cfg, seed).requests


def default_workload() -> WorkloadConfig:
    """Built-in default, no files needed: 2,000 requests, Poisson 12 req/s, Azure-2023-conversation lengths
    from the committed fit (clipped to Llama-3-8B's 8,192-token context, count reported), 3 tiers with the
    enterprise mix (10/70/20) and default SLOs.

    Rate: one Llama-3-8B/A100 replica saturates near 4–4.5 req/s of Azure conv (Vidur's reference run is
    100% busy at 4 req/s), so 12 req/s over 4 replicas is ~3 req/s each, ≈ 70–75% load.
    """
    return WorkloadConfig(num_requests=2000, seed=0, arrivals=PoissonConfig(rate=12.0),
                          lengths=FitLengthConfig(dataset="azure2023_conv", max_total_tokens=8192),
                          tiers=TiersConfig(num_tiers=3, mix="enterprise"))


def with_tier_slos(requests: list[Request], tier_set: TierSet) -> list[Request]:
    """Attach each request's tier SLO (for requests read directly with a reader); checks tiers are in range."""
    for r in requests:
        tier_set.check_tier(r.tier, f"request {r.id}.tier")
    return [replace(r, slo=tier_set[r.tier].slo) for r in requests]
