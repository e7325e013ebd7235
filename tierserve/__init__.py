"""tierserve: serve every LLM request at the latency its tier pays for."""

__version__ = "0.1.0"
