"""tierserve: serve every LLM request at the latency its tier pays for."""

from tierserve import _native

_native.install()      # before anything imports the simulator: compiled hot path, or its sources (see _native)

__version__ = "0.1.0"
