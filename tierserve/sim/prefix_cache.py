"""A replica's prefix cache: vLLM v1's automatic prefix caching rule, reference counts and LRU eviction.

The cache stores full hash blocks named by their chained hash (`Request.prefix_hashes`: hash *i* names the
prompt's first (*i*+1)·B tokens, so a hash fixes its position *i*). The rule is vLLM v1's:
- a hit is the longest prefix of the request's hashes that is cached, full blocks only, capped so that at least
  the prompt's last token is computed (at most prompt − 1 cached tokens, in whole blocks);
- a cached block is reference-counted: a running request holds it; a block no request holds stays cached in an
  LRU queue of free blocks (vLLM's free-block queue) and is evicted from the queue's head when space is needed;
- a request releases its blocks tail first (vLLM frees in reverse order), so a chain's tail is evicted before its
  head and a shorter cached prefix survives.
KV accounting: when the hash block size B differs from the KV block size K, hash block *i* occupies
ceil((i+1)·B/K) − ceil(i·B/K) KV blocks, so a cached prefix of n hash blocks occupies ceil(n·B/K) KV blocks
(the sum telescopes). The cache is bounded by `capacity_kv_blocks`.
Tier-aware eviction (optional, `tier_aware=True`): each cached block remembers the most important tier
(lowest index) that held it, and free blocks of less important tiers are evicted first (LRU within a tier).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


def kv_blocks_for_tokens(tokens: int, kv_block_tokens: int) -> int:
    """KV blocks that `tokens` tokens occupy (ceil)."""
    return -(-tokens // kv_block_tokens)


def cacheable_blocks(num_hashes: int, prompt_tokens: int, hash_block_tokens: int) -> int:
    """Hash blocks a hit may cover: the full blocks of the first prompt − 1 tokens (vLLM v1's cap)."""
    if prompt_tokens <= 0:
        return 0
    return min(num_hashes, (prompt_tokens - 1) // hash_block_tokens)


class PrefixCache:
    """Cached hash blocks of one replica, with reference counts and an LRU queue of unreferenced blocks."""

    def __init__(self, capacity_kv_blocks: int, hash_block_tokens: int, kv_block_tokens: int,
                 tier_aware: bool = False) -> None:
        if capacity_kv_blocks < 0:
            raise ValueError(f"capacity_kv_blocks: must be >= 0, got {capacity_kv_blocks}")
        if hash_block_tokens <= 0:
            raise ValueError(f"hash_block_tokens: must be > 0, got {hash_block_tokens}")
        if kv_block_tokens <= 0:
            raise ValueError(f"kv_block_tokens: must be > 0, got {kv_block_tokens}")
        self.capacity_kv_blocks = capacity_kv_blocks
        self.hash_block_tokens = hash_block_tokens
        self.kv_block_tokens = kv_block_tokens
        self._refs: dict[int, int] = {}              # cached hash -> requests holding it
        self._pos: dict[int, int] = {}               # cached hash -> its block position i
        self._free: OrderedDict[int, None] = OrderedDict()   # unreferenced cached hashes, eviction order first
        self.tier_aware = tier_aware
        self._tier: dict[int, int] = {}              # cached hash -> most important tier that held it
        self._free_by_tier: dict[int, OrderedDict[int, None]] = {}   # tier-aware: a free queue per tier
        self.used_kv_blocks = 0
        self.hit_tokens = 0                          # statistics: tokens served from the cache
        self.queried_tokens = 0                      # prompt tokens looked up
        self.evictions = 0

    def block_cost(self, position: int) -> int:
        """KV blocks hash block `position` adds to its prefix (ceil arithmetic)."""
        b, k = self.hash_block_tokens, self.kv_block_tokens
        return kv_blocks_for_tokens((position + 1) * b, k) - kv_blocks_for_tokens(position * b, k)

    def match(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Hash blocks of the longest cached prefix of `hashes`, under the prompt − 1 cap (no state change)."""
        limit = cacheable_blocks(len(hashes), prompt_tokens, self.hash_block_tokens)
        n = 0
        refs = self._refs
        while n < limit and hashes[n] in refs:
            n += 1
        return n

    def _hold(self, h: int, tier: int) -> None:
        if self._refs[h] == 0:
            del self._free[h]
            if self.tier_aware:
                del self._free_by_tier[self._tier[h]][h]
        self._refs[h] += 1
        if tier < self._tier[h]:
            self._tier[h] = tier

    def acquire(self, hashes: Sequence[int], prompt_tokens: int, tier: int = 0) -> int:
        """Take the hit for a request: hold its cached prefix and return the cached tokens."""
        n = self.match(hashes, prompt_tokens)
        for h in hashes[:n]:
            self._hold(h, tier)
        self.queried_tokens += prompt_tokens
        cached = n * self.hash_block_tokens
        self.hit_tokens += cached
        return cached

    def insert(self, hashes: Sequence[int], start: int, tier: int = 0) -> int:
        """Cache the request's computed blocks `start`.. (held by it); returns how many were stored.

        Stops at the first block that does not fit after evicting every free block (a chain must stay a prefix).
        A block already cached (by another request) is held instead of stored twice.
        """
        stored = 0
        for i in range(start, len(hashes)):
            h = hashes[i]
            if h in self._refs:
                self._hold(h, tier)
                continue
            cost = self.block_cost(i)
            if not self.make_room(cost):
                break
            self._refs[h] = 1
            self._pos[h] = i
            self._tier[h] = tier
            self.used_kv_blocks += cost
            stored += 1
        return stored

    def release(self, hashes: Sequence[int]) -> None:
        """A request lets go of its held blocks; unreferenced ones join the LRU queue tail first."""
        for h in reversed(hashes):
            r = self._refs.get(h)
            if r is None or r == 0:
                continue
            r -= 1
            self._refs[h] = r
            if r == 0:
                self._free[h] = None
                if self.tier_aware:
                    self._free_by_tier.setdefault(self._tier[h], OrderedDict())[h] = None

    def make_room(self, kv_blocks: int) -> bool:
        """Evict free blocks (LRU first) until `kv_blocks` more fit; False if they cannot."""
        while self.used_kv_blocks + kv_blocks > self.capacity_kv_blocks:
            if not self._free:
                return False
            if self.tier_aware:
                queue = self._free_by_tier[max(t for t, q in self._free_by_tier.items() if q)]
                h, _ = queue.popitem(last=False)
                del self._free[h]
            else:
                h, _ = self._free.popitem(last=False)
            del self._refs[h]
            del self._tier[h]
            self.used_kv_blocks -= self.block_cost(self._pos.pop(h))
            self.evictions += 1
        return True

    def evictable_kv_blocks(self) -> int:
        return sum(self.block_cost(self._pos[h]) for h in self._free)

    def __contains__(self, h: int) -> bool:
        return h in self._refs

    def __len__(self) -> int:
        return len(self._refs)

    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
