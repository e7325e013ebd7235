"""The compiled per-instance loops of a Llumnix dispatch and tick (`freeness.freest`, `migration_freeness_all`,
`pair_by_freeness`) give exactly what the policy's own methods give, one instance at a time, on every call
of a long sequence of changing loads (so the kept freeness is never stale)."""
from __future__ import annotations

import random

import pytest

from tierserve.policies.cluster.freeness import (
    CHARGE_BY_METHOD, InstanceLoad, KeptFreeness, freest, migration_freeness_all, pair_by_freeness,
)
from tierserve.policies.cluster.llumnix import LlumnixPolicy
from tierserve.policies.cluster.llumnix_k import LlumnixK, LlumnixKAdaptive
from tierserve.policies.cluster.migration_policy import pair_instances

NUM_TIERS = 3


class UsedBlocksCharge(LlumnixK):
    """A subclass with its own charge (reads a load field the built-in rules ignore): called, not inlined."""

    def dispatch_headroom(self, load, tier, budgets):
        return 0.25 * load.used_blocks + tier


def reference_pick(policy, loads, tier):
    """The dispatch argmax written plainly: (freest not busy, freest), −1 for none, ties to the lowest index."""
    best_free = best_any = -1
    f_free = f_any = 0.0
    for load in loads:
        f = load.freeness(policy.dispatch_headroom(load, tier, policy.headroom.budgets(load.total_blocks)))
        if best_any < 0 or f > f_any or (f == f_any and load.index < best_any):
            f_any, best_any = f, load.index
        if f >= policy.busy_threshold and (best_free < 0 or f > f_free or (f == f_free and load.index < best_free)):
            f_free, best_free = f, load.index
    return best_free, best_any


def random_counts(rng):
    tiers = rng.sample(range(NUM_TIERS), rng.randint(0, NUM_TIERS))     # random insertion order too
    return {t: rng.randint(1, 9) for t in tiers}


def random_load(rng, index, counts, m=400):
    return InstanceLoad(index, m, 16, rng.choice([0, 50, 200, 350, 390]), rng.choice([0, 3, 20]),
                        rng.randint(0, 4), rng.randint(0, 2), counts, rng.random() < 0.2, rng.random() < 0.2,
                        rng.random() < 0.05)


def evolve(rng, loads):
    """Next read: most loads the same object, some re-made on the same counts dict, some with new counts."""
    out = []
    for ld in loads:
        r = rng.random()
        if r < 0.5:
            out.append(ld)
        elif r < 0.8:
            out.append(random_load(rng, ld.index, ld.tier_counts, ld.total_blocks))
        else:
            out.append(random_load(rng, ld.index, random_counts(rng), ld.total_blocks))
    return out


@pytest.mark.parametrize("make", [lambda: LlumnixPolicy(num_tiers=NUM_TIERS), lambda: LlumnixK(num_tiers=NUM_TIERS),
                                  lambda: LlumnixKAdaptive(num_tiers=NUM_TIERS),
                                  lambda: UsedBlocksCharge(num_tiers=NUM_TIERS)],
                         ids=["llumnix", "llumnix_k", "adaptive", "own_charge"])
def test_freest_equals_the_plain_argmax_on_every_read(make):
    policy = make()
    if isinstance(policy, UsedBlocksCharge):
        assert policy._charge_rule == CHARGE_BY_METHOD
    rng = random.Random(7)
    loads = [random_load(rng, i, random_counts(rng), m=400 if i % 5 else 600) for i in range(16)]
    kept_by_tier = {t: {} for t in range(NUM_TIERS)}
    reused = 0
    for step in range(400):
        if isinstance(policy, LlumnixKAdaptive) and step % 17 == 0:
            policy.headroom.scales[rng.randrange(NUM_TIERS)] *= rng.choice([0.5, 1.25])   # budgets change
        tier = rng.randrange(NUM_TIERS)
        kept = kept_by_tier[tier]
        before = {i: e.load for i, e in kept.items()}
        got = freest(loads, tier, policy.headroom, policy.busy_threshold, kept, policy._charge_rule,
                     policy.dispatch_headroom)
        assert got == reference_pick(policy, loads, tier), step
        reused += sum(before.get(ld.index) is ld for ld in loads)
        loads = evolve(rng, loads)
    assert reused > 1000                # the kept freeness was exercised


def test_a_stale_kept_freeness_would_change_the_answer():
    """The check above can fail: a kept entry is trusted for the same load object and equal budgets."""
    policy = LlumnixK(num_tiers=NUM_TIERS)
    loads = [InstanceLoad(i, 400, 16, 100 + 10 * i, 0, 2, 0, {1: 2}) for i in range(4)]
    kept: dict[int, KeptFreeness] = {}
    assert freest(loads, 2, policy.headroom, policy.busy_threshold, kept, policy._charge_rule, None) == (0, 0)
    kept[3].free = 1e9                  # planted: a wrong freeness kept for instance 3's (unchanged) load
    assert freest(loads, 2, policy.headroom, policy.busy_threshold, kept, policy._charge_rule, None) == (3, 3)
    assert reference_pick(policy, loads, 2) == (0, 0)


def test_migration_freeness_all_equals_the_method():
    rng = random.Random(3)
    for policy in (LlumnixPolicy(num_tiers=NUM_TIERS), LlumnixK(num_tiers=NUM_TIERS)):
        loads = [random_load(rng, i, random_counts(rng), m=400 if i % 3 else 500) for i in range(40)]
        assert migration_freeness_all(loads, policy.headroom) == [policy.migration_freeness(ld) for ld in loads]


def reference_pairs(loads, free, threshold):
    """pair_instances as it was written before the compiled pairing (sorts with key functions)."""
    ready = [ld for ld in loads if not ld.migrating]
    src = [ld for ld in ready if ld.terminating or ld.preempted_waiting or free(ld) < threshold]
    dst = [ld for ld in ready if not (ld.terminating or ld.preempted_waiting) and free(ld) >= threshold]
    src.sort(key=lambda ld: (free(ld), ld.index))
    dst.sort(key=lambda ld: (-free(ld), ld.index))
    return list(zip(src, dst))


def test_pairing_equals_the_key_sorted_reference():
    rng = random.Random(11)
    for _ in range(200):
        loads = [random_load(rng, i, random_counts(rng)) for i in rng.sample(range(64), rng.randint(0, 30))]
        frees = {ld.index: rng.choice([-5.0, 0.0, 2.5, 3.0, 7.0, 50.0, float("inf"), float("-inf")])
                 for ld in loads}                                  # many ties: the index decides
        pairs = pair_instances(loads, lambda ld: frees[ld.index], 3.0)
        expected = reference_pairs(loads, lambda ld: frees[ld.index], 3.0)
        assert len(pairs) == len(expected)
        assert all(a is b and c is d for (a, c), (b, d) in zip(pairs, expected))     # the very same loads
    assert pair_by_freeness([], [], 3.0) == []
