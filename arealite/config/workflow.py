"""What a rollout workflow adds to a sample: tool calling (`ToolUseConfig`) and agents that are
programs (`AgentProgramConfig`). Neither is a section of `GRPOConfig`: the example scripts that
read them add them in their own subclass (`tool_use`, `agent`)."""

from __future__ import annotations

from dataclasses import dataclass

from arealite.config.fields import check_positive, setting


@dataclass
class ToolUseConfig:
    """Tool calling in rollouts (`arealite.workflow.ToolUseWorkflow`): examples/tools_grpo.py's `tool_use`."""

    tools: list[str] = setting(
        factory=lambda: ["arealite.workflow.tools:Calculator"],
        help='"module:Class" of each tool, built without arguments',
    )
    max_turns: int = setting(3, "model replies per sample, the final answer included")

    def __post_init__(self) -> None:
        check_positive("tool_use", "max_turns", self.max_turns)


@dataclass
class AgentProgramConfig:
    """Agents that are programs (`arealite.agent.AgentProgramWorkflow`): examples/openai_agent_grpo.py's `agent`."""

    command: list[str] = setting(
        factory=list,
        help="the program and its arguments, run once per sample with OPENAI_BASE_URL set to its session of the "
        "endpoint (docs/agents.md)",
    )
    timeout: float = setting(60.0, "seconds a program may run; past it it is killed and its group rejected")
    host: str = setting("127.0.0.1", "where the endpoint listens; loopback unless the programs run elsewhere")

    def __post_init__(self) -> None:
        check_positive("agent", "timeout", self.timeout)
