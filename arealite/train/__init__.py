"""Training: the FSDP2 engine, the PPO actor and critic, the reference model, weight upload."""

from arealite.train.actor import PPOActor
from arealite.train.critic import PPOCritic
from arealite.train.engine import FSDPEngine
from arealite.train.reference import ReferenceModel

__all__ = ["FSDPEngine", "PPOActor", "PPOCritic", "ReferenceModel"]
