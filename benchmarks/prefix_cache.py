"""Cache-only replay of a trace through `PrefixCache` over a KV-size curve, against the trace's reuse bound.

Requests are taken one at a time in arrival order: each takes its hit, stores its prompt's full blocks and
releases them before the next arrives. There is no timing, no concurrency and no decode KV, so this is the
hit rate of the cache rule and eviction order alone at a given cache size (an upper envelope for the simulator
with the same KV, which also holds running requests' blocks); it prints no TTFT. With an unlimited cache it
equals the reuse bound exactly (tests/test_prefix_cache.py checks that).
"""
from __future__ import annotations

import argparse
import time

from tierserve.sim.prefix_cache import PrefixCache


def replay_hit_rate(requests, capacity_kv_blocks: int, kv_block_tokens: int = 16) -> float:
    """Token hit rate (cached / prompt tokens) of a sequential replay with a cache of `capacity_kv_blocks`."""
    if not requests:
        return 0.0
    cache = PrefixCache(capacity_kv_blocks, requests[0].hash_block_tokens, kv_block_tokens)
    for r in requests:
        hashes = r.prefix_hashes
        cached = cache.acquire(hashes, r.prompt_tokens)
        cache.insert(hashes, cached // cache.hash_block_tokens)
        cache.release(hashes)
    return cache.hit_rate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv-block-tokens", type=int, default=16)
    a = ap.parse_args()
    import sys
    sys.path.insert(0, "benchmarks")
    from prefix_reuse import MOONCAKE, mooncake_requests
    from tierserve.core.paths import shared_data
    from tierserve.workload.sessions import prefix_reuse_bound
    if shared_data(*MOONCAKE) is None:
        raise SystemExit("mooncake conversation trace not found (../shared/data/traces/)")
    reqs = sorted(mooncake_requests(), key=lambda r: r.arrival_s)
    bound = prefix_reuse_bound(reqs).token_fraction
    print(f"mooncake conversation: {len(reqs):,} requests, reuse bound (tokens) {bound:.1%}")
    print(f"{'KV blocks':>12}{'KV tokens':>14}{'hit rate':>10}{'/ bound':>9}{'s':>7}")
    for blocks in (2_000, 8_000, 32_000, 128_000, 512_000, 2_048_000, 10**9):
        t = time.perf_counter()
        h = replay_hit_rate(reqs, blocks, a.kv_block_tokens)
        size = "unlimited" if blocks >= 10**9 else f"{blocks:,}"
        toks = "" if blocks >= 10**9 else f"{blocks * a.kv_block_tokens:,}"
        print(f"{size:>12}{toks:>14}{h:>10.1%}{h / bound:>9.3f}{time.perf_counter() - t:>7.2f}")


if __name__ == "__main__":
    main()
