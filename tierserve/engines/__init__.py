"""Real engines running tierserve's replica policies (DESIGN.md, "Real engines").

An adapter builds the same read-only `ReplicaView` the simulator builds, over the engine's own request
objects, and drives the same `LocalPolicy` objects with it. Floors: this package imports `tierserve.core` and
`tierserve.policies` only — never the simulator — and imports an engine (vLLM) only in the module that
subclasses it, so the rest is importable and testable without the engine installed.
"""
