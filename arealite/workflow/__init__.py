"""Rollout workflows: how one data record becomes a scored trajectory."""

from arealite.workflow.base import RolloutWorkflow
from arealite.workflow.rlvr import RLVRWorkflow

__all__ = ["RLVRWorkflow", "RolloutWorkflow"]
