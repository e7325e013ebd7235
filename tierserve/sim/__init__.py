"""The discrete-event cluster simulator."""
from tierserve.sim.config import ClusterConfig, ReplicaConfig
from tierserve.sim.simulate import SimResult, simulate

__all__ = ["ClusterConfig", "ReplicaConfig", "SimResult", "simulate"]
