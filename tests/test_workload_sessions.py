"""Multi-turn session generator: growing shared prefixes, session ids, think times, determinism, bad input."""
from __future__ import annotations

from collections import defaultdict

import pytest

from tierserve.core.errors import ConfigError
from tierserve.workload.config import WorkloadConfig, build_workload, stream_workload
from tierserve.workload.sessions import SessionsConfig, prefix_reuse_bound


def build(num_requests=600, seed=0, **sessions):
    return build_workload(WorkloadConfig.from_dict({"num_requests": num_requests, "seed": seed,
                                                    "sessions": sessions}))


def by_session(reqs):
    out = defaultdict(list)
    for r in reqs:
        out[r.session_id].append(r)
    return out


def test_turn_prompt_and_hashes_extend_the_previous_turn():
    reqs = build().requests
    sessions = by_session(reqs)
    assert len(sessions) > 50 and max(len(t) for t in sessions.values()) >= 3
    for turns in sessions.values():
        for prev, cur in zip(turns, turns[1:]):
            # turn k's prompt = turn k-1's prompt + its output + a new input (>= 1 token)
            assert cur.prompt_tokens >= prev.prompt_tokens + prev.output_tokens + 1
            assert cur.prefix_hashes[:len(prev.prefix_hashes)] == prev.prefix_hashes
            assert len(cur.prefix_hashes) == cur.prompt_tokens // 16
            assert (cur.app, cur.tier) == (prev.app, prev.tier)


def test_system_prompt_shared_within_an_app_and_not_across():
    reqs = build(apps=[{"name": "a", "tier": 0, "system_prompt_tokens": 160},
                       {"name": "b", "tier": 1, "system_prompt_tokens": 160}]).requests
    first = {}
    for r in reqs:
        first.setdefault(r.app, set()).add(r.prefix_hashes[:10])     # the system prompt's 10 blocks
    assert len(first["a"]) == 1 and len(first["b"]) == 1 and first["a"] != first["b"]
    # block 11 already holds session tokens: different sessions never share it
    eleventh = {r.prefix_hashes[10] for r in reqs if r.session_id in (0, 1, 2) and len(r.prefix_hashes) > 10}
    assert len(eleventh) == len({r.session_id for r in reqs if r.session_id in (0, 1, 2)})


def test_ids_sorted_and_think_time_respected():
    reqs = build(think_time_mean_s=12.0, think_time_min_s=5.0).requests
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    gaps = [b.arrival_s - a.arrival_s for t in by_session(reqs).values() for a, b in zip(t, t[1:])]
    assert gaps and min(gaps) >= 5.0
    assert 9.0 < sum(gaps) / len(gaps) < 15.0      # mean 12 s (a few hundred gaps)


def test_first_n_arrivals_exactly():
    few, many = build(num_requests=200).requests, build(num_requests=800).requests
    key = [(r.arrival_s, r.session_id, r.prompt_tokens, r.prefix_hashes) for r in few]
    assert key == [(r.arrival_s, r.session_id, r.prompt_tokens, r.prefix_hashes) for r in many[:200]]


def test_num_sessions_when_num_requests_null_and_fixed_turns():
    w = build_workload(WorkloadConfig.from_dict({"num_requests": None, "sessions": {
        "num_sessions": 30, "turns": "fixed", "mean_turns": 3, "max_context_tokens": 100000}}))
    assert len(w.requests) == 90 and sorted(len(t) for t in by_session(w.requests).values()) == [3] * 30


def test_context_limit_ends_sessions():
    reqs = build(max_context_tokens=1600, mean_turns=8).requests
    assert all(r.prompt_tokens + r.output_tokens <= 1600 for r in reqs)


def test_deterministic_per_seed_and_streamed_alike():
    a, b, c = build(seed=3).requests, build(seed=3).requests, build(seed=4).requests
    assert a == b and a != c
    cfg = WorkloadConfig.from_dict({"num_requests": 600, "seed": 3, "sessions": {}})
    assert list(stream_workload(cfg).requests) == a


def test_default_tiers_and_reuse_bound():
    reqs = build(num_requests=1000).requests
    assert {r.tier for r in reqs} == {0, 1, 2} and {r.app for r in reqs} == {"tier0", "tier1", "tier2"}
    bound = prefix_reuse_bound(reqs)
    assert bound.blocks == sum(len(r.prefix_hashes) for r in reqs)
    assert 0.5 < bound.block_fraction < 1.0 and bound.token_fraction <= bound.block_fraction + 0.01
    assert prefix_reuse_bound(reqs[:1]).blocks_seen == 0


@pytest.mark.parametrize("sessions, field", [
    ({"session_rate": 0}, "session_rate"),
    ({"think_time_min_s": 40.0}, "think_time_min_s"),
    ({"mean_turns": 20, "max_turns": 4}, "mean_turns"),
    ({"turns": "fixed", "mean_turns": 2.5}, "mean_turns"),
    ({"hash_block_tokens": 0}, "hash_block_tokens"),
    ({"apps": [{"name": "a", "system_prompt_tokens": 9000}]}, "apps"),
    ({"apps": [{"name": "a", "tier": 7}]}, "tier"),
    ({"turn": 3}, "turn"),
])
def test_bad_parameters_name_the_field(sessions, field):
    with pytest.raises(ConfigError) as e:
        build(**sessions)
    assert field in str(e.value)


def test_sessions_exclude_arrivals_and_need_a_count():
    with pytest.raises(ConfigError, match="arrivals"):
        WorkloadConfig.from_dict({"sessions": {}, "arrivals": {"kind": "poisson", "rate": 3.0}})
    with pytest.raises(ConfigError, match="num_sessions"):
        WorkloadConfig.from_dict({"num_requests": None, "sessions": {}})
    assert SessionsConfig().hash_block_tokens == 16
