"""`tierserve router`: an OpenAI-compatible, tier-aware HTTP router in front of vLLM engines, dispatching with
the simulator's `ClusterPolicy` classes over views filled from the engines' /metrics (docs/router.md).

Only the CLI imports this package. Modules: `config` (validated YAML), `tiers` (a request's tier and SLO),
`view` (an engine as a policy sees it), `engines` (scraping), `dispatch` (caps, overflow, the global queue),
`app` (the ASGI endpoints), `metrics` (Prometheus), `serve` (uvicorn), `fake_engine` (a stand-in vLLM).
"""
from tierserve.router.config import RouterConfig

__all__ = ["RouterConfig"]
