"""`AgentProgramWorkflow`: an agent that is a separate program, trained through the OpenAI-compatible endpoint.

Each of the `group_size` samples runs `command` as a subprocess with its own `AgentEndpoint`
session (`OPENAI_BASE_URL`, `AREALITE_TASK`, `AREALITE_REWARD_URL` in its environment). Its
reward is `reward_fn` on the final reply, else the reward it POSTed, else a last stdout line
`reward=<float>`, on its last turn, plus any reward it POSTed for a turn (`{"reward": r, "turn":
k}`); its trajectory is the session's conversation, one row per chain. A sample that times out,
crashes, makes no completion or reports no reward rejects its group and is counted in `stats`
(docs/agents.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import re
import signal
import uuid
from collections.abc import Sequence
from typing import Any

from arealite.agent.endpoint import AgentEndpoint, AgentSession
from arealite.config import GenerationHyperparameters
from arealite.interfaces import GenerationEngine, RewardFn, RolloutWorkflow, Trajectory
from arealite.reward.pool import RewardPool
from arealite.rollout.batch import concat_padded
from arealite.workflow.scoring import Scorer
from arealite.workflow.seeding import sample_seed

logger = logging.getLogger("arealite.agent")

_REWARD_LINE = re.compile(r"^\s*reward\s*=\s*(\S+)\s*$")
_FAILURES = ("agent_timeouts", "agent_crashes", "agent_no_completion", "agent_no_reward")


class AgentProgramWorkflow(RolloutWorkflow):
    """Runs `command` once per sample against its own session of an OpenAI-compatible endpoint."""

    def __init__(
        self,
        command: Sequence[str],
        tokenizer: Any,
        gconfig: GenerationHyperparameters,
        reward_fn: RewardFn | None = None,
        timeout: float = 60.0,
        host: str = "127.0.0.1",
        reward_pool: RewardPool | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if not command:
            raise ValueError("command is empty; give the agent program to run, e.g. ['python', 'agent.py']")
        if timeout <= 0:
            raise ValueError(f"timeout={timeout} must be > 0 (seconds an agent program may run)")
        self.command = list(command)
        self.tokenizer, self.gconfig, self.timeout, self.host = tokenizer, gconfig, timeout, host
        self.env = dict(env or {})
        self.stats: dict[str, int] = {"episodes": 0, "rejected_groups": 0, "samples": 0, **dict.fromkeys(_FAILURES, 0)}
        self.scorer = None
        if reward_fn is not None:
            self.scorer = Scorer(reward_fn, reward_pool or RewardPool(max_workers=2), "reject", self.stats)
        self.endpoint: AgentEndpoint | None = None
        self.last_failure = ""
        self._starting = asyncio.Lock()

    async def arun_episode(self, engine: GenerationEngine, data: dict[str, Any]) -> Trajectory | None:
        endpoint = await self._endpoint(engine)
        group_id = uuid.uuid4().hex  # one server for the whole group (prefix reuse)
        version = engine.get_version()
        results = await asyncio.gather(
            *(self._sample(endpoint, data, group_id, i, version) for i in range(self.gconfig.group_size))
        )
        self.stats["episodes"] += 1
        if any(r is None for r in results):
            self.stats["rejected_groups"] += 1
            return None
        return concat_padded(results)

    async def _endpoint(self, engine: GenerationEngine) -> AgentEndpoint:
        async with self._starting:
            if self.endpoint is None:
                endpoint = AgentEndpoint(engine, self.tokenizer, self.gconfig, self.host)
                await endpoint.start()
                self.endpoint = endpoint
        return self.endpoint

    async def _sample(
        self, endpoint: AgentEndpoint, data: dict[str, Any], group_id: str, index: int, version: int
    ) -> Trajectory | None:
        """One program run; its trajectory, or None (counted) when it failed."""
        gconfig = self.gconfig
        if gconfig.sampling_seed is not None:  # each sample its own seed: reproducible runs
            key = str(data.get("id", json.dumps(data, sort_keys=True, default=str)))
            gconfig = _with_seed(gconfig, sample_seed(gconfig.sampling_seed, key, index, version))
        session = endpoint.open_session(group_id, gconfig)
        self.stats["samples"] += 1
        try:
            outcome, stdout = await self._run(session, data)
        finally:
            endpoint.close_session(session.id)
        if outcome != "ok":
            return self._fail(outcome, stdout, session)
        if not session.client.completions:
            return self._fail("agent_no_completion", stdout, session)
        reward = await self._reward(session, stdout, data)
        if reward is None and session.turn_rewards:
            reward = 0.0  # per-turn rewards only: they are the episode's rewards
        if reward is None:
            return self._fail("agent_no_reward", stdout, session)
        return session.trajectory(reward)

    async def _run(self, session: AgentSession, data: dict[str, Any]) -> tuple[str, str]:
        """Run the program to its end or its timeout: ("ok" | failure counter name, its output)."""
        task = json.dumps(data, default=str)
        env = {
            **os.environ, **self.env, "OPENAI_BASE_URL": session.base_url, "OPENAI_API_KEY": "arealite",
            "AREALITE_TASK": task, "AREALITE_REWARD_URL": f"{session.base_url}/reward",
        }  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(task.encode()), self.timeout)
        except (TimeoutError, asyncio.CancelledError) as e:
            _kill_group(proc.pid)
            await proc.wait()
            if isinstance(e, asyncio.CancelledError):
                raise
            return "agent_timeouts", f"killed after {self.timeout}s"
        text = out.decode(errors="replace")
        return ("ok" if proc.returncode == 0 else "agent_crashes"), text

    async def _reward(self, session: AgentSession, stdout: str, data: dict[str, Any]) -> float | None:
        if self.scorer is not None:
            last = session.client.completions[-1]
            answer = last.message.get("content") or ""
            prompt = self.tokenizer.decode(last.prompt_ids, skip_special_tokens=False)
            return await self.scorer.score(prompt, answer, last.prompt_ids, last.output_ids, data)
        if session.reward is not None:
            return session.reward
        lines = [line for line in stdout.splitlines() if line.strip()]
        match = _REWARD_LINE.match(lines[-1]) if lines else None
        try:
            return float(match.group(1)) if match else None
        except ValueError:
            return None

    def _fail(self, counter: str, output: str, session: AgentSession) -> None:
        self.stats[counter] += 1
        errors = f" (its 4xx answers: {session.errors[-3:]})" if session.errors else ""
        self.last_failure = f"{counter}{errors}: {output[-2000:]}"
        logger.warning("sample rejected, %s", self.last_failure[:500])
        return None

    async def aclose(self) -> None:
        """Stop listening (on the rollout loop)."""
        if self.endpoint is not None:
            await self.endpoint.stop()
            self.endpoint = None


def _with_seed(gconfig: GenerationHyperparameters, seed: int) -> GenerationHyperparameters:
    import dataclasses

    return dataclasses.replace(gconfig, sampling_seed=seed)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the program and anything it started
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:  # in the child between fork and exec: SIGKILL when the trainer dies
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
