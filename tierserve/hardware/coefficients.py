"""The committed fitted coefficients (data/exec_coefficients.json) and the rules for reusing them.

Lookup order for a (model, GPU, TP): its own profile fit; else the same-architecture GPU's fit (H200 uses
H100's, A100 PCIe uses A100 SXM's: same SMs and tensor cores, only HBM differs, which the roofline rescales); else the profiled model on
that GPU with the same hidden size (same GEMM shapes up to N, so the same kernel efficiencies); else roofline
defaults. Attention terms are rescaled from the reference fit by geometry and GPU peak/bandwidth.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tierserve.hardware.fits import (
    AllReduceFit,
    AttentionFit,
    LayerFit,
    allreduce_from_json,
    allreduce_to_json,
    attention_from_json,
    attention_to_json,
    layerfit_from_json,
    layerfit_to_json,
)
from tierserve.hardware.fit_schema import validated_store
from tierserve.hardware.specs import GPUSpec, ModelSpec, get_gpu, get_model

_NUMBER_LIST = re.compile(r"\[([-+0-9.eE,\s]+)\]")
DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_COEFFICIENTS = DATA_DIR / "exec_coefficients.json"

# GPUs without their own profiles borrow kernel efficiencies from a same-architecture part.
_SAME_ARCH = {"H200": "H100-80GB", "A100-80GB-PCIe": "A100-80GB"}


@dataclass(slots=True)
class CoefficientStore:
    """Fits keyed by GPU name → model name → TP, plus attention fits and all-reduce tables."""

    layers: dict[str, dict[str, dict[int, LayerFit]]] = field(default_factory=dict)
    attention: list[AttentionFit] = field(default_factory=list)
    allreduce: dict[str, dict[int, AllReduceFit]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def layer_fit(self, model: ModelSpec, gpu: GPUSpec, tp: int) -> tuple[LayerFit | None, str]:
        """The best available non-attention fit and a note saying where it came from."""
        gpus = [gpu.name] + ([_SAME_ARCH[gpu.name]] if gpu.name in _SAME_ARCH else [])
        for gname in gpus:
            by_model = self.layers.get(gname, {})
            if model.name in by_model and tp in by_model[model.name]:
                return by_model[model.name][tp], f"profile {gname}/{model.name}/tp{tp}"
        for gname in gpus:
            by_model = self.layers.get(gname, {})
            peers = [get_model(n) for n, fits in by_model.items() if tp in fits]
            peers = [p for p in peers if p.hidden == model.hidden]
            if peers:
                best = min(peers, key=lambda p: abs(p.intermediate - model.intermediate))
                return by_model[best.name][tp], f"efficiencies of {gname}/{best.name}/tp{tp}"
        return None, "roofline defaults"

    def attention_fit(self, model: ModelSpec, gpu: GPUSpec, tp: int) -> tuple[AttentionFit | None, str]:
        """Exact-geometry fit on this GPU and TP if one exists, else the first (reference) fit to rescale."""
        for a in self.attention:
            ref = get_model(a.ref_model)
            same_geom = (ref.hidden, ref.num_q_heads, ref.num_kv_heads, ref.head_dim) == (
                model.hidden, model.num_q_heads, model.num_kv_heads, model.head_dim)
            if same_geom and a.ref_gpu == gpu.name and a.ref_tp == tp:
                return a, f"attention profile {a.ref_model}/{a.ref_gpu}/tp{a.ref_tp}"
        if self.attention:
            a = self.attention[0]
            return a, f"rescaled from {a.ref_model}/{a.ref_gpu}/tp{a.ref_tp}"
        return None, "roofline defaults"

    def reference_attention(self) -> AttentionFit | None:
        return self.attention[0] if self.attention else None

    def allreduce_fit(self, gpu: GPUSpec, tp: int) -> tuple[AllReduceFit | None, str]:
        names = [gpu.network_dir] if gpu.network_dir else []
        if gpu.name in _SAME_ARCH:
            names.append(get_gpu(_SAME_ARCH[gpu.name]).network_dir)
        for n in names:
            if n and tp in self.allreduce.get(n, {}):
                return self.allreduce[n][tp], f"network profile {n}"
        return None, "alpha-beta roofline on NVLink"

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "layers": {g: {m: {str(tp): layerfit_to_json(f) for tp, f in fits.items()} for m, fits in bm.items()}
                       for g, bm in self.layers.items()},
            "attention": [attention_to_json(a) for a in self.attention],
            "allreduce": {n: {str(w): allreduce_to_json(f) for w, f in fits.items()} for n, fits in self.allreduce.items()},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CoefficientStore":
        return cls(
            layers={g: {m: {int(tp): layerfit_from_json(f) for tp, f in fits.items()} for m, fits in bm.items()}
                    for g, bm in d.get("layers", {}).items()},
            attention=[attention_from_json(a) for a in d.get("attention", [])],
            allreduce={n: {int(w): allreduce_from_json(f) for w, f in fits.items()}
                       for n, fits in d.get("allreduce", {}).items()},
            meta=d.get("meta", {}),
        )

    def save(self, path: str | Path) -> None:
        text = json.dumps(self.to_json(), indent=1, sort_keys=True)
        # lists of numbers on one line each (correction knots run to hundreds of values)
        text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", text)
        Path(path).write_text(text + "\n")


@lru_cache(maxsize=8)
def load_store(path: str | None = None) -> CoefficientStore:
    """The committed coefficients (empty store when the file is absent: everything falls back to roofline)."""
    p = Path(path) if path else DEFAULT_COEFFICIENTS
    if not p.is_file():
        return CoefficientStore()
    return CoefficientStore.from_json(validated_store(p))
