"""The fitted coefficients' data types and their JSON form: what a profile fit produces and the committed
`data/exec_coefficients.json` stores (the GEMM roofline fit, `GemmFit`, lives in roofline.py with its formula).

Bottom of the hardware fits: imports only specs-level modules, so the store, the model builders and the
calibration above can all read these types.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import TierserveError
from tierserve.hardware.roofline import GemmFit, LinearFit


class ProfileError(TierserveError, ValueError):
    """A profile or iteration log that cannot be fitted; names the file and the column."""

    def __init__(self, source: str | Path, column: str | None, problem: str) -> None:
        self.source, self.column = str(source), column
        where = f"{source}" + (f", column {column!r}" if column else "")
        super().__init__(f"{where}: {problem}")


@dataclass(slots=True)
class FitReport:
    """Held-out error of one operator fit."""

    source: str
    op: str
    key: str          # e.g. "Llama-3-8B/A100-80GB/tp1"
    n_train: int
    n_test: int
    mape_test: float
    mape_train: float


@dataclass(slots=True)
class LayerFit:
    """All non-attention operator fits of one (model, GPU, TP)."""

    gemm: dict[str, GemmFit] = field(default_factory=dict)
    elementwise: dict[str, LinearFit] = field(default_factory=dict)


@dataclass(slots=True)
class AttentionFit:
    """Per-layer attention costs of one geometry (ms), from an attention profile.

    prefill = p0 + p_tok·chunk + p_pair·pairs; decode = d0 + d_req·B + d_ctx·Σctx;
    KV write = piecewise-linear in prefill tokens (knots) + save_req·B for decodes, with the decode write's fixed
    part (save_d0) folded into d0. Vidur's own KV-write predictor is kept as well: `pooled_save_tokens/_ms`, the
    mean of `attn_kv_cache_save` over all rows (decode and prefill) at each num_tokens = max(chunk, batch size),
    which is what its random forest on that one feature predicts (see `pooled_kv_save`).
    """

    p0: float
    p_tok: float
    p_pair: float
    d0: float
    d_req: float
    d_ctx: float
    save_knots: tuple[float, ...] = ()
    save_ms: tuple[float, ...] = ()
    save_req: float = 0.0
    save_d0: float = 0.0
    pooled_save_tokens: tuple[float, ...] = ()
    pooled_save_ms: tuple[float, ...] = ()
    # reference geometry + GPU, so the terms can be rescaled to other models/GPUs
    ref_model: str = ""
    ref_gpu: str = ""
    ref_tp: int = 1
    eff_attn_flop: float = 0.0
    eff_attn_bw: float = 0.0


@dataclass(slots=True)
class AllReduceFit:
    """NCCL all-reduce latency vs message size for one group size: knots of (log2 bytes, ms)."""

    num_workers: int
    log2_bytes: tuple[float, ...]
    ms: tuple[float, ...]

    def time_ms(self, nbytes: np.ndarray) -> np.ndarray:
        x = np.log2(np.maximum(np.asarray(nbytes, dtype=float), 1.0))
        base = np.interp(x, self.log2_bytes, self.ms)
        # past the largest knot the ring is bandwidth-bound: time grows ∝ bytes
        over = x > self.log2_bytes[-1]
        return np.where(over, self.ms[-1] * np.exp2(x - self.log2_bytes[-1]), base)


def gemm_to_json(f: GemmFit) -> dict[str, Any]:
    return {"eff_flop": round(f.eff_flop, 5), "eff_bw": round(f.eff_bw, 5), "overhead_ms": f.overhead_ms,
            "corr_log2t": list(f.corr_log2t), "corr_factor": [round(c, 5) for c in f.corr_factor],
            "tile_tokens": f.tile_tokens, **({"waves": True} if f.waves else {})}


def gemm_from_json(d: dict[str, Any]) -> GemmFit:
    return GemmFit(float(d["eff_flop"]), float(d["eff_bw"]), float(d["overhead_ms"]),
                   tuple(d.get("corr_log2t", ())), tuple(d.get("corr_factor", ())), int(d.get("tile_tokens", 1)),
                   bool(d.get("waves", False)))


def layerfit_to_json(lf: LayerFit) -> dict[str, Any]:
    return {"gemm": {k: gemm_to_json(v) for k, v in lf.gemm.items()},
            "elementwise": {k: [round(v.a_ms, 7), round(v.b_ms, 10)] for k, v in lf.elementwise.items()}}


def layerfit_from_json(d: dict[str, Any]) -> LayerFit:
    return LayerFit({k: gemm_from_json(v) for k, v in d["gemm"].items()},
                    {k: LinearFit(float(v[0]), float(v[1])) for k, v in d["elementwise"].items()})


def attention_to_json(a: AttentionFit) -> dict[str, Any]:
    return asdict(a)


def attention_from_json(d: dict[str, Any]) -> AttentionFit:
    d = dict(d)
    d["save_knots"] = tuple(d.get("save_knots", ()))
    d["save_ms"] = tuple(d.get("save_ms", ()))
    d["pooled_save_tokens"] = tuple(d.get("pooled_save_tokens", ()))
    d["pooled_save_ms"] = tuple(d.get("pooled_save_ms", ()))
    return AttentionFit(**d)


def allreduce_to_json(a: AllReduceFit) -> dict[str, Any]:
    return {"num_workers": a.num_workers, "log2_bytes": list(a.log2_bytes), "ms": [round(v, 5) for v in a.ms]}


def allreduce_from_json(d: dict[str, Any]) -> AllReduceFit:
    return AllReduceFit(int(d["num_workers"]), tuple(d["log2_bytes"]), tuple(d["ms"]))
