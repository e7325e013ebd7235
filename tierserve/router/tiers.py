"""A request's tier and SLO from what the client sent, in a fixed order of sources.

1. the API key (`Authorization: Bearer KEY`) through `api_keys`;
2. the tier header (`x-tier`: a tier name or index);
3. OpenAI's `service_tier` body field through `service_tiers`;
4. the Gateway API Inference Extension's criticality band (`criticalities`), then a gateway priority header
   (higher = more important; the first tier, from the top, whose `gateway_priority` is <= it);
5. llm-d's `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms`: the least important tier whose own targets are at
   least as tight (a tier without a target never meets one); none that tight: tier 0.
Nothing named: `default_tier`. SLO headers, whatever set the tier, override that tier's targets key by key.

vLLM runs lower `priority` first, as tierserve's tier index orders tiers; a gateway's priority orders the other
way, so it reaches the engine inverted, as the index of the tier it lands in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from tierserve.core.slo import SLO
from tierserve.router.config import RouterConfig

SLO_HEADERS = {"x-llm-d-slo-ttft-ms": "ttft_s", "x-llm-d-slo-tpot-ms": "tbt_s"}


class RequestRefused(Exception):
    """A request the router answers itself: HTTP status, OpenAI-style error body, extra headers, outcome."""

    def __init__(self, status: int, message: str, param: str | None = None, *, outcome: str = "bad_request",
                 headers: Mapping[str, str] | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.outcome = status, message, param, outcome
        self.headers = dict(headers or {})
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True, slots=True)
class Resolved:
    tier: int          # tier index, 0 = most important
    slo: SLO           # targets forwarded to the engine
    source: str        # which rule named the tier


class TierResolver:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.names = [t.name for t in cfg.tiers]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.slos = [t.to_slo() for t in cfg.tiers]

    def resolve(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> Resolved:
        """Headers with lower-case names (Starlette's are case-insensitive). Raises RequestRefused (400)
        naming the header or field that is malformed or names no tier."""
        targets = self._slo_headers(headers)
        tier, source = self._named_tier(headers, body)
        if tier is None and targets:
            tier, source = self._tier_for_targets(targets), "slo_headers"
        if tier is None:
            tier, source = self.cfg.default_tier_index, "default"
        base = self.slos[tier]
        if targets:
            merged = {k: getattr(base, k) for k in ("ttft_s", "tbt_s", "ttlt_s")} | targets
            slo = SLO(attainment=base.attainment, **merged)
        else:
            slo = base
        return Resolved(tier, slo, source)

    def _named_tier(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[int | None, str]:
        cfg = self.cfg
        auth = headers.get("authorization", "")
        if cfg.api_keys and auth[:7].lower() == "bearer ":
            name = cfg.api_keys.get(auth[7:].strip())
            if name is not None:
                return self.index[name], "api_key"
        raw = headers.get(cfg.tier_header)
        if raw is not None:
            return self._tier_by_name(raw.strip(), cfg.tier_header), "tier_header"
        st = body.get("service_tier")
        if st is not None:
            if not isinstance(st, str) or st not in cfg.service_tiers:
                allowed = ", ".join(cfg.service_tiers) or "none configured (service_tiers)"
                raise RequestRefused(400, f"service_tier: got {st!r}; allowed: {allowed}", "service_tier")
            return self.index[cfg.service_tiers[st]], "service_tier"
        crit = headers.get(cfg.criticality_header)
        if crit is not None:
            name = cfg.criticalities.get(crit.strip())
            if name is None:
                allowed = ", ".join(cfg.criticalities) or "none configured (criticalities)"
                raise RequestRefused(400, f"{cfg.criticality_header}: got {crit!r}; allowed: {allowed}",
                                     cfg.criticality_header)
            return self.index[name], "criticality"
        prio = headers.get(cfg.gateway_priority_header)
        if prio is not None:
            return self._tier_for_priority(prio), "gateway_priority"
        return None, ""

    def _tier_by_name(self, raw: str, field: str) -> int:
        if raw in self.index:
            return self.index[raw]
        if raw.isdigit() and int(raw) < len(self.names):
            return int(raw)
        raise RequestRefused(400, f"{field}: got {raw[:80]!r}; allowed: {', '.join(self.names)} "
                                  f"(or an index 0..{len(self.names) - 1})", field)

    def _tier_for_priority(self, raw: str) -> int:
        header = self.cfg.gateway_priority_header
        try:
            p = int(raw.strip())
        except ValueError:
            raise RequestRefused(400, f"{header}: got {raw[:80]!r}; allowed: an integer (higher = more "
                                      "important)", header) from None
        tiers = self.cfg.tiers
        if not any(t.gateway_priority is not None for t in tiers):
            raise RequestRefused(400, f"{header}: no tier has a gateway_priority configured", header)
        for i, t in enumerate(tiers):
            if t.gateway_priority is not None and p >= t.gateway_priority:
                return i
        return len(tiers) - 1

    def _slo_headers(self, headers: Mapping[str, str]) -> dict[str, float]:
        targets: dict[str, float] = {}
        for header, key in SLO_HEADERS.items():
            raw = headers.get(header)
            if raw is None:
                continue
            try:
                ms = float(raw.strip())
            except ValueError:
                ms = math.nan
            if not (math.isfinite(ms) and 0 < ms <= self.cfg.max_slo_ms):
                raise RequestRefused(400, f"{header}: got {raw[:80]!r}; allowed: a number of milliseconds in "
                                          f"(0, {self.cfg.max_slo_ms:g}]", header)
            targets[key] = ms / 1000.0
        return targets

    def _tier_for_targets(self, targets: dict[str, float]) -> int:
        for i in range(len(self.slos) - 1, -1, -1):
            slo = self.slos[i]
            if all(getattr(slo, k) is not None and getattr(slo, k) <= v for k, v in targets.items()):
                return i
        return 0
