import pytest

from tierserve.sim.prefix_cache import PrefixCache, cacheable_blocks, kv_blocks_for_tokens


def test_cap_is_prompt_minus_one_in_full_blocks():
    assert cacheable_blocks(4, 64, 16) == 3       # fully cached prompt still computes its last token
    assert cacheable_blocks(4, 65, 16) == 4
    assert cacheable_blocks(2, 100, 16) == 2      # only as many blocks as hashes
    assert cacheable_blocks(3, 0, 16) == 0


def test_longest_prefix_hit_and_refcounts():
    c = PrefixCache(100, 16, 16)
    assert c.acquire([1, 2, 3], 60) == 0
    assert c.insert([1, 2, 3], 0) == 3
    c.release([1, 2, 3])
    assert c.match([1, 2, 9], 100) == 2           # stops at the first miss
    assert c.match([9, 2, 3], 100) == 0           # prefix only
    assert c.acquire([1, 2, 3, 4], 100) == 48
    assert c._refs[1] == 1 and not c._free
    c.release([1, 2, 3, 4])
    assert list(c._free) == [3, 2, 1]             # tail first into the LRU queue


def test_lru_evicts_chain_tail_first_and_never_held_blocks():
    c = PrefixCache(3, 16, 16)
    c.insert([1, 2, 3], 0)
    c.release([1, 2, 3])
    assert c.acquire([1], 40) == 16               # holds block 1
    assert c.insert([7, 8], 0) == 2               # evicts 3 then 2, keeps the held 1
    assert 1 in c and 3 not in c and 2 not in c
    assert c.used_kv_blocks == 3
    assert c.insert([5], 0) == 0                  # nothing free: does not fit
    assert c.evictions == 2


def test_ceil_mapping_hash_to_kv_blocks():
    c = PrefixCache(1000, 512, 16)
    assert c.block_cost(0) == 32
    c2 = PrefixCache(1000, 16, 32)
    assert [c2.block_cost(i) for i in range(4)] == [1, 0, 1, 0]
    c3 = PrefixCache(1000, 24, 16)
    assert sum(c3.block_cost(i) for i in range(5)) == kv_blocks_for_tokens(5 * 24, 16)
    c3.insert([1, 2, 3, 4, 5], 0)
    assert c3.used_kv_blocks == 8


def test_hit_rate_and_bad_input():
    c = PrefixCache(10, 16, 16)
    c.insert([1, 2], 0)
    c.acquire([1, 2], 64)
    assert c.hit_rate() == 0.5
    with pytest.raises(ValueError, match="hash_block_tokens"):
        PrefixCache(10, 0, 16)


def _sessions(n=300, seed=0):
    from tierserve.workload.config import WorkloadConfig, build_workload
    from tierserve.workload.sessions import SessionsConfig
    cfg = WorkloadConfig(num_requests=n, seed=seed, sessions=SessionsConfig(hash_block_tokens=16))
    return sorted(build_workload(cfg).requests, key=lambda r: r.arrival_s)


def test_replay_equals_bound_unlimited_and_stays_below_it():
    import sys
    sys.path.insert(0, "benchmarks")
    from prefix_cache import replay_hit_rate
    from tierserve.workload.sessions import prefix_reuse_bound
    reqs = _sessions()
    bound = prefix_reuse_bound(reqs)
    exact = bound.cacheable_tokens / bound.prompt_tokens
    assert replay_hit_rate(reqs, 10**9) == pytest.approx(exact, abs=1e-12)
    rates = [replay_hit_rate(reqs, n) for n in (50, 500, 5000, 50000)]
    assert all(r <= exact + 1e-12 for r in rates)
    assert rates == sorted(rates) and rates[0] < rates[-1]


def test_tier_aware_eviction_takes_lower_tiers_first():
    for aware, survivor in ((False, 20), (True, 10)):
        c = PrefixCache(2, 16, 16, tier_aware=aware)
        c.insert([10], 0, tier=0)             # older, tier 0
        c.release([10])
        c.insert([20], 0, tier=2)             # newer, tier 2
        c.release([20])
        c.insert([30], 0, tier=1)             # needs one block: plain LRU evicts 10, tier-aware evicts 20
        assert survivor in c and 30 in c and len(c) == 2
    c = PrefixCache(2, 16, 16, tier_aware=True)
    c.insert([10], 0, tier=2)
    c.acquire([10, 11], 40, tier=0)            # a tier-0 holder protects it as tier 0
    c.release([10])
    c.release([10])
    c.insert([20], 0, tier=1)
    c.release([20])
    c.insert([30], 0, tier=0)
    assert 10 in c and 20 not in c
