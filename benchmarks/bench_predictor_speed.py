#!/usr/bin/env python3
"""Microseconds per single iteration_time call (target ≤ 10 µs) and per predict_many batch of 16 (≤ 40 µs)."""
from __future__ import annotations

import random
import timeit

import numpy as np

from tierserve.hardware.exec_model import make_execution_model, prefill_attention_pairs


def main() -> None:
    m = make_execution_model("llama-3-8b", "a100", 1)
    rng = random.Random(0)
    shapes = []
    for _ in range(1000):
        p = rng.choice([0, 0, 256, 512, 2048])
        b = rng.randint(0, 256)
        shapes.append((p, prefill_attention_pairs(p, rng.randint(0, 4096)), b, b * rng.randint(16, 4096)))
    it = m.iteration_time
    n = 200
    t = min(timeit.repeat(lambda: [it(*s) for s in shapes], number=n, repeat=3))
    single_us = t / (n * len(shapes)) * 1e6
    db = m.decode_base_time
    t = min(timeit.repeat(lambda: [db(s[2]) for s in shapes], number=n, repeat=3))
    base_us = t / (n * len(shapes)) * 1e6
    arr = [np.array([s[i] for s in shapes[:16]]) for i in range(4)]
    t = min(timeit.repeat(lambda: m.predict_many(*arr), number=20000, repeat=3))
    batch_us = t / 20000 * 1e6
    t = min(timeit.repeat(lambda: m.max_prefill_tokens_within(0.05, 64, 64 * 1024, 512), number=20000, repeat=3))
    chunk_us = t / 20000 * 1e6
    print(f"iteration_time (single call):          {single_us:6.2f} µs   (target ≤ 10)")
    print(f"decode_base_time (single call):        {base_us:6.2f} µs")
    print(f"predict_many (batch of 16):            {batch_us:6.2f} µs   (target ≤ 40)")
    print(f"max_prefill_tokens_within (search):    {chunk_us:6.2f} µs")


if __name__ == "__main__":
    main()
