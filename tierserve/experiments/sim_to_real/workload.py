"""sim_to_real's workload: the engine limits both sides share, the tier mix, the traces and `--slo` targets."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

BLOCK_SIZE = 32
NUM_BLOCKS = 160            # vLLM keeps one as its null block: 159 usable
MAX_NUM_SEQS = 8
TOKEN_BUDGET = 256
MAX_MODEL_LEN = 512
TIER_MIX = (0.2, 0.3, 0.5)
PROMPT = (32, 320)
OUTPUT = (16, 96)
QUANTILES = (50, 90, 99)
FRONTEND_PROBES = 24        # idle-engine requests, one at a time (the frontend without load; reported)
CAPACITY_BURST = 120
TIER_SLOS: list[dict] = [{}, {}, {}]     # per tier, xargs targets (`--slo`); set once per invocation in `main`


def parse_slos(text: str) -> list[dict]:
    """`--slo`: one `ttft_s:tbt_s` per tier, comma-separated, `-` for a tier without targets."""
    parts = [p.strip() for p in text.split(",")] if text else ["-"] * len(TIER_MIX)
    if len(parts) != len(TIER_MIX):
        raise SystemExit(f"--slo {text!r}: {len(TIER_MIX)} entries (one per tier), got {len(parts)}")
    out = []
    for p in parts:
        if p == "-":
            out.append({})
            continue
        try:
            ttft, tbt = (float(x) for x in p.split(":"))
        except ValueError:
            raise SystemExit(f"--slo {text!r}: entry {p!r} is not ttft_s:tbt_s (seconds) or -") from None
        if not (ttft > 0 and tbt > 0):
            raise SystemExit(f"--slo {text!r}: entry {p!r}: targets must be > 0 s")
        out.append({"ttft_s": ttft, "tbt_s": tbt})
    return out


def load_builder():
    spec = importlib.util.spec_from_file_location("build_tiny_llama", ROOT / "scripts" / "build_tiny_llama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_trace(n: int, rate: float, seed: int) -> list[dict]:
    """n requests, Poisson arrivals at `rate` req/s (rate <= 0: all at once), uniform lengths, tier mix."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if rate > 0:
            t += rng.expovariate(rate)
        tier = rng.choices(range(len(TIER_MIX)), TIER_MIX)[0]
        out.append({"i": i, "arrival_s": t, "prompt_tokens": rng.randint(*PROMPT),
                    "output_tokens": rng.randint(*OUTPUT), "tier": tier})
    return out
