"""arealite: RL post-training of LLMs. The names a training script needs (docs/architecture.md §2.4).

    from arealite import GRPOConfig, PPOActor, RemoteSGLangEngine, RLVRWorkflow, WeightSync, ...

Names load on first use (PEP 562), so `import arealite` imports nothing heavy and the
launchers (`python -m arealite.launcher.local`) never load torch. Parts needed only for
something unusual stay in their subpackages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arealite.utils.imports import lazy_exports

# public name -> the module that defines it (one home per name)
_EXPORTS = {
    # configuration and ranks
    "GRPOConfig": "arealite.config",
    "load_config": "arealite.config",
    "save_config": "arealite.config",
    "init_distributed": "arealite.world",
    # data and task
    "load_records": "arealite.data.loader",
    "filter_by_prompt_length": "arealite.data.loader",
    "create_dataloader": "arealite.data.loader",
    "train_dataloader": "arealite.data.loader",
    "reward_fn_for": "arealite.eval.task",
    "held_out_records": "arealite.eval.task",
    # rollout
    "rollout_client": "arealite.rollout.client",  # the client of config.server.backend's servers
    "RemoteSGLangEngine": "arealite.rollout.client",  # AReaL's names of the same client, per backend
    "RemoteVLLMEngine": "arealite.rollout.client",
    "StepBatches": "arealite.rollout.step_batches",  # each step's batch: sync, async, lockstep, dynamic sampling
    "TeacherClient": "arealite.rollout.teacher",
    "RewardPool": "arealite.reward.pool",
    "RLVRWorkflow": "arealite.workflow.rlvr",
    "MultiTurnWorkflow": "arealite.workflow.multi_turn",
    "ToolUseWorkflow": "arealite.workflow.tool_use",
    # training and weight sync
    "PPOActor": "arealite.train.actor",
    "PPOCritic": "arealite.train.critic",
    "ReferenceModel": "arealite.train.reference",
    "WeightSync": "arealite.weight_sync.sync",
    # around the loop
    "Evaluator": "arealite.eval.evaluator",
    "Recover": "arealite.recover",
    "EngineGroup": "arealite.recover",
    "StatsLogger": "arealite.stats.logger",
    "StatsTracker": "arealite.stats.tracker",
    "StepTimer": "arealite.stats.timer",
    "RunSummary": "arealite.stats.summary",
    "batch_stats": "arealite.stats.batch",
    # writing your own parts
    "RolloutWorkflow": "arealite.interfaces",
    "InferenceEngine": "arealite.interfaces",
    "GenerationEngine": "arealite.interfaces",
    "RolloutRunner": "arealite.interfaces",
    "WeightSyncTarget": "arealite.interfaces",
    "TrainEngine": "arealite.interfaces",
    "ModelRequest": "arealite.types",
    "ModelResponse": "arealite.types",
    "trajectory_from_tokens": "arealite.rollout.batch",
    # servers from Python
    "launch_server_process": "arealite.server.process",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the same names for type checkers and IDEs, which do not run __getattr__
    from arealite.config import GRPOConfig, load_config, save_config
    from arealite.data.loader import create_dataloader, filter_by_prompt_length, load_records, train_dataloader
    from arealite.eval.evaluator import Evaluator
    from arealite.eval.task import held_out_records, reward_fn_for
    from arealite.interfaces import (
        GenerationEngine,
        InferenceEngine,
        RolloutRunner,
        RolloutWorkflow,
        TrainEngine,
        WeightSyncTarget,
    )
    from arealite.recover import EngineGroup, Recover
    from arealite.reward.pool import RewardPool
    from arealite.rollout.batch import trajectory_from_tokens
    from arealite.rollout.client import RemoteSGLangEngine, RemoteVLLMEngine, rollout_client
    from arealite.rollout.step_batches import StepBatches
    from arealite.rollout.teacher import TeacherClient
    from arealite.server.process import launch_server_process
    from arealite.stats.batch import batch_stats
    from arealite.stats.logger import StatsLogger
    from arealite.stats.summary import RunSummary
    from arealite.stats.timer import StepTimer
    from arealite.stats.tracker import StatsTracker
    from arealite.train.actor import PPOActor
    from arealite.train.critic import PPOCritic
    from arealite.train.reference import ReferenceModel
    from arealite.types import ModelRequest, ModelResponse
    from arealite.weight_sync.sync import WeightSync
    from arealite.workflow.multi_turn import MultiTurnWorkflow
    from arealite.workflow.rlvr import RLVRWorkflow
    from arealite.workflow.tool_use import ToolUseWorkflow
    from arealite.world import init_distributed
