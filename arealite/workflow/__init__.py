"""Rollout workflows: how one data record becomes a scored trajectory.

Their base class, `RolloutWorkflow`, is in `arealite.interfaces`."""

from arealite.workflow.multi_turn import MultiTurnWorkflow
from arealite.workflow.rlvr import RLVRWorkflow
from arealite.workflow.tool_use import ToolUseWorkflow

__all__ = ["MultiTurnWorkflow", "RLVRWorkflow", "ToolUseWorkflow"]
