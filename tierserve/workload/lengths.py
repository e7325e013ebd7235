"""(prompt, output) length distributions: empirical resampling, committed parametric fits, fixed choices,
and the explicit, reported `max_total_tokens` clip.

Parametric fits are mixtures of bivariate lognormals (a Gaussian mixture on (ln prompt, ln output)), which
keeps the prompt/output correlation where a dataset has one (arXiv, Mooncake synthetic) and fits the
multi-modal marginals better than a single lognormal. Samples are rounded to integers and truncated to the
data's [min, max] range by rejection. Parameters live in `data/length_fits.json`, written by
`scripts/fit_lengths.py`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Protocol

import numpy as np

from tierserve.core.errors import ConfigError, TraceError
from tierserve.core.paths import shared_data

# Dataset name → (path parts under shared/data, reader format). DeepSeek-R1 has only a PMF (fit only).
DATASETS: dict[str, tuple[tuple[str, ...], str]] = {
    "azure2023_conv": (("traces", "azure2023_conv.csv"), "csv"),
    "azure2023_code": (("traces", "azure2023_code.csv"), "csv"),
    "sharegpt": (("traces", "lengths", "sharegpt_8k_llama2tok.csv"), "lengths"),
    "arxiv": (("traces", "lengths", "arxiv_summarization_llama2tok.csv"), "lengths"),
    "mooncake_conversation": (("traces", "mooncake_fast25_conversation.csv"), "csv"),
}
PMF_DATASETS: dict[str, tuple[str, ...]] = {
    "deepseek_r1": ("traces", "distributions", "servegen_deepseek_r1_length_pmf.csv"),
}

_MAX_REJECTION_ROUNDS = 1000


class LengthSampler(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True, slots=True)
class EmpiricalLengths:
    """Samples (prompt, output) pairs jointly from observed rows; `replace=False` draws distinct rows
    (as Vidur's synthetic generator does), so n must not exceed the row count."""

    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    replace: bool = True
    source: str = "empirical"

    def __post_init__(self) -> None:
        if len(self.prompts) == 0 or len(self.prompts) != len(self.outputs):
            raise ConfigError("lengths.rows", len(self.prompts), "a non-empty set of (prompt, output) pairs")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if not self.replace and n > len(self.prompts):
            raise ConfigError("num_requests", n,
                              f"at most {len(self.prompts)} rows of {self.source} when sampling without replacement")
        idx = rng.choice(len(self.prompts), size=n, replace=self.replace)
        return np.asarray(self.prompts, np.int64)[idx], np.asarray(self.outputs, np.int64)[idx]

    @classmethod
    def from_file(cls, path: str | Path, fmt: str, replace: bool = True,
                  min_output: int | None = None) -> EmpiricalLengths:
        """Rows of any trace format, or `fmt="lengths"` for a `prompt_tokens,output_tokens` file."""
        from tierserve.workload.readers import read_lengths_rows, read_rows

        res = (read_lengths_rows(path, min_output=min_output) if fmt == "lengths"
               else read_rows(path, fmt, min_output=min_output))
        return cls(tuple(r.prompt_tokens for r in res.rows), tuple(r.output_tokens for r in res.rows),
                   replace, str(path))

    @classmethod
    def from_dataset(cls, name: str, replace: bool = True) -> EmpiricalLengths:
        """A named shared dataset (see DATASETS); ConfigError when shared data is absent."""
        return cls.from_file(dataset_path(name), DATASETS[name][1], replace)


def dataset_path(name: str) -> Path:
    if name not in DATASETS:
        raise ConfigError("lengths.dataset", name, " | ".join(DATASETS))
    p = shared_data(*DATASETS[name][0])
    if p is None:
        raise ConfigError("lengths.dataset", name, "a dataset present under shared/data (not found here)")
    return p


@dataclass(frozen=True, slots=True)
class LognormalMixtureLengths:
    """Mixture of bivariate lognormals on (prompt, output), truncated to [min, max] per marginal."""

    weights: tuple[float, ...]
    means: tuple[tuple[float, float], ...]                          # (mu_ln_prompt, mu_ln_output)
    covs: tuple[tuple[tuple[float, float], tuple[float, float]], ...]
    prompt_range: tuple[int, int]
    output_range: tuple[int, int]
    name: str = "fit"
    bounds: str = "reject"        # "reject": truncate by redrawing; "clamp": pile out-of-range mass at the bound (caps)

    def __post_init__(self) -> None:
        k = len(self.weights)
        if k == 0 or len(self.means) != k or len(self.covs) != k:
            raise ConfigError(f"length_fits[{self.name}]", k, "equal, non-zero numbers of weights/means/covs")
        if abs(sum(self.weights) - 1.0) > 1e-6 or min(self.weights) < 0:
            raise ConfigError(f"length_fits[{self.name}].weights", self.weights, "non-negative, summing to 1")
        for nm, (lo, hi) in (("prompt_range", self.prompt_range), ("output_range", self.output_range)):
            if not 1 <= lo <= hi:
                raise ConfigError(f"length_fits[{self.name}].{nm}", (lo, hi), "1 <= min <= max")
        if self.bounds not in ("reject", "clamp"):
            raise ConfigError(f"length_fits[{self.name}].bounds", self.bounds, "reject | clamp")

    def _draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        comp = rng.choice(len(self.weights), size=n, p=np.asarray(self.weights))
        z = rng.standard_normal((n, 2))
        chol = np.linalg.cholesky(np.asarray(self.covs, float))           # (K, 2, 2)
        x = np.asarray(self.means, float)[comp] + np.einsum("nij,nj->ni", chol[comp], z)
        x = np.minimum(x, 40.0)  # exp overflow guard; far beyond any range, so rejected below
        return np.rint(np.exp(x[:, 0])).astype(np.int64), np.rint(np.exp(x[:, 1])).astype(np.int64)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if self.bounds == "clamp":
            p, o = self._draw(n, rng)
            return np.clip(p, *self.prompt_range), np.clip(o, *self.output_range)
        p_out, o_out = np.empty(0, np.int64), np.empty(0, np.int64)
        for _ in range(_MAX_REJECTION_ROUNDS):
            need = n - len(p_out)
            if need <= 0:
                break
            p, o = self._draw(max(need, 16) + need // 4, rng)  # oversample a little for rejections
            ok = ((p >= self.prompt_range[0]) & (p <= self.prompt_range[1])
                  & (o >= self.output_range[0]) & (o <= self.output_range[1]))
            p_out = np.concatenate((p_out, p[ok]))
            o_out = np.concatenate((o_out, o[ok]))
        if len(p_out) < n:
            raise ConfigError(f"length_fits[{self.name}]", "ranges", "a fit whose mass lies inside its ranges")
        return p_out[:n], o_out[:n]

    @classmethod
    def from_dict(cls, name: str, d: dict) -> LognormalMixtureLengths:
        try:
            return cls(tuple(d["weights"]), tuple(tuple(m) for m in d["means"]),
                       tuple(tuple(tuple(r) for r in c) for c in d["covs"]),
                       tuple(d["prompt_range"]), tuple(d["output_range"]), name, d.get("bounds", "reject"))
        except (KeyError, TypeError) as e:
            raise ConfigError(f"length_fits[{name}]", str(e), "weights, means, covs, prompt_range, output_range") from None


@dataclass(frozen=True, slots=True)
class ChoiceLengths:
    """A few fixed (prompt, output) shapes with weights (e.g. 90% short 125/100 + 10% long 2k/6k)."""

    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not (len(self.prompts) == len(self.outputs) == len(self.weights) >= 1):
            raise ConfigError("lengths.options", len(self.prompts), "at least one {prompt, output, weight}")
        for i, (p, o, w) in enumerate(zip(self.prompts, self.outputs, self.weights)):
            if p < 1 or o < 1:
                raise ConfigError(f"lengths.options[{i}]", (p, o), "prompt >= 1 and output >= 1")
            if not (w >= 0 and math.isfinite(w)):
                raise ConfigError(f"lengths.options[{i}].weight", w, "a finite weight >= 0")
        if sum(self.weights) <= 0:
            raise ConfigError("lengths.options", self.weights, "at least one weight > 0")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        w = np.asarray(self.weights, float)
        idx = rng.choice(len(w), size=n, p=w / w.sum())
        return np.asarray(self.prompts, np.int64)[idx], np.asarray(self.outputs, np.int64)[idx]


@lru_cache(maxsize=1)
def load_length_fits() -> dict:
    """The committed fits file (package data), as a dict keyed by dataset name."""
    text = resources.files("tierserve.workload").joinpath("data/length_fits.json").read_text()
    return json.loads(text)


def fitted_lengths(dataset: str) -> LognormalMixtureLengths:
    """The committed parametric fit for `dataset` (no shared data needed)."""
    fits = load_length_fits()["fits"]
    if dataset not in fits:
        raise ConfigError("lengths.dataset", dataset, " | ".join(sorted(fits)))
    return LognormalMixtureLengths.from_dict(dataset, fits[dataset])


@dataclass(frozen=True, slots=True)
class ClipResult:
    prompts: np.ndarray
    outputs: np.ndarray
    num_clipped: int                 # requests whose prompt was shortened


def clip_total_tokens(prompts: np.ndarray, outputs: np.ndarray, max_total_tokens: int,
                      source: str = "lengths", offset: int = 0) -> ClipResult:
    """Vidur's rule: cut the prompt so prompt + output <= max_total_tokens; report how many were cut.

    A request whose output alone leaves no room for a 1-token prompt is an error naming its index.
    """
    if not isinstance(max_total_tokens, int) or max_total_tokens < 2:
        raise ConfigError("lengths.max_total_tokens", max_total_tokens, "an integer >= 2, or null")
    p = np.asarray(prompts, np.int64)
    o = np.asarray(outputs, np.int64)
    bad = np.flatnonzero(o > max_total_tokens - 1)
    if len(bad):
        i = int(bad[0])
        raise TraceError(source, i + offset, "output_tokens", int(o[i]),
                         f"output leaves no room for a prompt under max_total_tokens={max_total_tokens}")
    excess = np.maximum(p + o - max_total_tokens, 0)
    return ClipResult(p - excess, o.copy(), int(np.count_nonzero(excess)))
