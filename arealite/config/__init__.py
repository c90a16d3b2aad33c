"""Typed configuration: one dataclass per component, nested in one experiment config.

`load_config(argv, GRPOConfig)` reads `--config file.yaml` plus `key=value` overrides with
omegaconf and returns real dataclass objects. Unknown keys fail naming their dotted path and
the closest valid names; wrong types fail naming the field and the expected type.

Each field is documented once, beside its definition in the module of its section. Derived
values are properties. Validation that needs more than a type lives in `__post_init__` and
says what to set instead. Every public name is importable from here.
"""

from __future__ import annotations

from arealite.config.data import DatasetConfig, DatasetType, EvaluatorConfig
from arealite.config.distill import DistillConfig
from arealite.config.experiment import GRPOConfig, WeightUpdateMode
from arealite.config.fields import setting
from arealite.config.generation import GREEDY_TEMPERATURE, GenerationHyperparameters
from arealite.config.loading import ConfigError, choices, load_config, save_config
from arealite.config.reward import JUDGE_RUBRIC, JudgeConfig, JudgeVerdict, RewardModelConfig, RewardModelDtype
from arealite.config.rollout import InferenceEngineConfig, PauseMode, Schedule, ServerBackend, ServerConfig, ServerDtype
from arealite.config.run import LauncherConfig, RecoverConfig, RecoverMode, StatsLoggerConfig, WandbMode
from arealite.config.train import (
    GroupNorm,
    GroupStd,
    IsLevel,
    KlEstimator,
    LoRAConfig,
    LossAggMode,
    LrScheduler,
    MicroBatchSpec,
    OptimizerConfig,
    OverlongStage,
    PolicyLoss,
    PPOActorConfig,
    PPOCriticConfig,
    RolloutCorrectionLevel,
    RolloutRejectionLevel,
    SFTConfig,
    TrainDtype,
    TrainEngineConfig,
    TruncatedBaseline,
    TrustRegionKind,
)
from arealite.config.workflow import AgentProgramConfig, ToolUseConfig

__all__ = [
    "GREEDY_TEMPERATURE",
    "JUDGE_RUBRIC",
    "AgentProgramConfig",
    "ConfigError",
    "DatasetConfig",
    "DatasetType",
    "DistillConfig",
    "EvaluatorConfig",
    "GRPOConfig",
    "GenerationHyperparameters",
    "GroupNorm",
    "GroupStd",
    "InferenceEngineConfig",
    "IsLevel",
    "JudgeConfig",
    "JudgeVerdict",
    "KlEstimator",
    "LauncherConfig",
    "LoRAConfig",
    "LossAggMode",
    "LrScheduler",
    "MicroBatchSpec",
    "OptimizerConfig",
    "OverlongStage",
    "PPOActorConfig",
    "PPOCriticConfig",
    "PauseMode",
    "PolicyLoss",
    "RecoverConfig",
    "RecoverMode",
    "RewardModelConfig",
    "RewardModelDtype",
    "RolloutCorrectionLevel",
    "RolloutRejectionLevel",
    "TrustRegionKind",
    "SFTConfig",
    "Schedule",
    "ServerBackend",
    "ServerConfig",
    "ServerDtype",
    "StatsLoggerConfig",
    "ToolUseConfig",
    "TrainDtype",
    "TrainEngineConfig",
    "TruncatedBaseline",
    "WandbMode",
    "WeightUpdateMode",
    "choices",
    "load_config",
    "save_config",
    "setting",
]
