"""Training: the FSDP2 engine, the PPO actor and critic, weight upload to the servers."""

from arealite.train.actor import FSDPPPOActor, PPOActor
from arealite.train.engine import FSDPEngine

__all__ = ["FSDPEngine", "FSDPPPOActor", "PPOActor"]
