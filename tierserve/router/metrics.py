"""The router's Prometheus metrics, per tier, named in vLLM's style (`tierserve:<what>[_unit]`).

Each router has its own registry (several routers in one process — tests — never share counters).
`outcome` of a request: finished, error (engine failed mid-answer), engine_timeout, shed (429: tier full,
queue full, queue timeout), unavailable (503), cancelled (client left), bad_request (400/413), policy_error.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                     40.0, 80.0, 160.0, 640.0)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("tierserve:requests", "Requests that ended, by asked tier, served tier and outcome.",
                                ["tier", "served_tier", "outcome"], registry=r)
        self.shed = Counter("tierserve:requests_shed", "Requests refused with 429, by tier and reason.",
                            ["tier", "reason"], registry=r)
        self.downgraded = Counter("tierserve:requests_downgraded", "Requests served below the tier they asked for.",
                                  ["tier", "served_tier"], registry=r)
        self.dispatched = Counter("tierserve:requests_dispatched", "Requests sent to an engine, per served tier.",
                                  ["served_tier", "engine"], registry=r)
        self.queued = Gauge("tierserve:num_requests_queued", "Requests waiting in the router's global queue.",
                            ["tier"], registry=r)
        self.in_flight = Gauge("tierserve:num_requests_in_flight", "Requests at engines, per served tier.",
                               ["tier"], registry=r)
        self.ttft = Histogram("tierserve:time_to_first_token_seconds", "Arrival at the router to first token.",
                              ["tier"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.ttlt = Histogram("tierserve:e2e_request_latency_seconds", "Arrival at the router to the last byte.",
                              ["tier"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.queue_time = Histogram("tierserve:request_queue_time_seconds", "Time in the router's global queue.",
                                    ["tier"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.engine_up = Gauge("tierserve:engine_up", "1 while the engine's /metrics answers.", ["engine"],
                               registry=r)
        self.engine_outstanding = Gauge("tierserve:engine_num_requests_outstanding",
                                        "Running + waiting at the engine as the policy sees it.", ["engine"],
                                        registry=r)
        self.engine_kv_usage = Gauge("tierserve:engine_kv_cache_usage_perc", "The engine's KV usage (fraction).",
                                     ["engine"], registry=r)
