"""`AgentEndpoint`: an OpenAI-compatible HTTP endpoint over the rollout client, one session per episode.

    endpoint = AgentEndpoint(engine, tokenizer, gconfig); await endpoint.start()  # loopback, free port
    session = endpoint.open_session()   # session.base_url: what the program's OpenAI(base_url=...) gets
    ...                                 # the program POSTs <base_url>/chat/completions (and /reward)
    endpoint.close_session(session.id); trajectory = session.trajectory(reward)

Each session is a `ChatClient`, so its trajectory is the conversation's tokens as generated,
model tokens in the loss. Bad requests get OpenAI's error body (400), unknown or closed
sessions 404; streaming is refused. Routes and headers: docs/agents.md.
"""

from __future__ import annotations

import json
import math
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from arealite.chat import ChatClient
from arealite.config import GenerationHyperparameters
from arealite.interfaces import GenerationEngine

SESSION_HEADER = "X-Session-Id"
MAX_BODY_BYTES = 8 * 1024 * 1024


class _ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


@dataclass
class AgentSession:
    """One episode's conversations: the chat client that records them and what the program reported."""

    id: str
    client: ChatClient
    base_url: str
    reward: float | None = None  # POSTed to <base_url>/reward
    turn_rewards: dict[int, float] = field(default_factory=dict)  # turn (completion index) -> reward POSTed for it
    requests: int = 0
    errors: list[str] = field(default_factory=list)  # the 4xx messages sent back (shown when an episode fails)

    def trajectory(self, reward: float = 0.0) -> dict:
        """The episode's rows (`ChatClient.trajectory`): `reward` on the last turn plus the per-turn rewards."""
        n = len(self.client.completions)
        turns = [self.turn_rewards.get(k, 0.0) for k in range(n)]
        return self.client.trajectory(reward, turn_rewards=turns)


class AgentEndpoint:
    """Serves `/s/{id}/v1/chat/completions` (and `/v1/chat/completions` + `X-Session-Id`) on the running loop."""

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        gconfig: GenerationHyperparameters,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.engine, self.tokenizer, self.gconfig = engine, tokenizer, gconfig
        self.host, self.port = host, port
        self.sessions: dict[str, AgentSession] = {}
        self.stats: dict[str, int] = {"requests": 0, "bad_requests": 0, "unknown_session": 0}
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen (idempotent). `port=0` takes a free port; `self.port` is then the one taken."""
        if self._runner is not None:
            return
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/s/{session}/v1/chat/completions", self._chat)
        app.router.add_post("/s/{session}/v1/reward", self._reward)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/reward", self._reward)
        app.router.add_get("/s/{session}/v1/models", self._models)
        app.router.add_get("/v1/models", self._models)
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def open_session(
        self, group_id: str | None = None, gconfig: GenerationHyperparameters | None = None
    ) -> AgentSession:
        """A new session; requests to its `base_url` are recorded by its own chat client."""
        if self._runner is None:
            raise RuntimeError("the endpoint is not listening; await endpoint.start() first")
        sid = uuid.uuid4().hex
        client = ChatClient(self.engine, self.tokenizer, gconfig or self.gconfig, group_id)
        session = AgentSession(sid, client, f"{self.address}/s/{sid}/v1")
        self.sessions[sid] = session
        return session

    def close_session(self, session_id: str) -> AgentSession:
        """End a session: it answers 404 from now on. Returns it."""
        return self.sessions.pop(session_id)

    # ---- handlers ----

    def _session(self, request: web.Request) -> AgentSession:
        sid = request.match_info.get("session") or request.headers.get(SESSION_HEADER)
        if not sid:
            raise _ApiError(
                404, f"no session: use a session's base URL (/s/<id>/v1) or send the {SESSION_HEADER} header"
            )
        session = self.sessions.get(sid)
        if session is None:
            self.stats["unknown_session"] += 1
            raise _ApiError(404, f"session {sid!r} is unknown or finished", "not_found_error")
        return session

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _ApiError(400, f"the request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise _ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            session = self._session(request)
            body = await self._body(request)
            self.stats["requests"] += 1
            session.requests += 1
            if body.get("stream"):
                raise _ApiError(400, "stream=true is not supported by this endpoint; leave it unset", param="stream")
            if not isinstance(body.get("messages"), list):
                raise _ApiError(400, "messages must be a list of chat messages", param="messages")
            try:
                completion = await session.client.create(**body)
            except (ValueError, TypeError, NotImplementedError, KeyError) as e:
                session.errors.append(str(e))
                raise _ApiError(400, str(e)) from None
            return web.json_response(_wire(completion))
        except _ApiError as e:
            return _error(e, self.stats)

    async def _reward(self, request: web.Request) -> web.Response:
        try:
            session = self._session(request)
            body = await self._body(request)
            reward = body.get("reward")
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise _ApiError(
                    400, f'reward must be a finite number, got {reward!r}: {{"reward": 1.0}}', param="reward"
                )
            turn = _turn(session, body)
            if turn is None:
                session.reward = float(reward)
            else:
                session.turn_rewards[turn] = float(reward)
            return web.json_response({"ok": True} if turn is None else {"ok": True, "turn": turn})
        except _ApiError as e:
            return _error(e, self.stats)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "arealite"}]}
        )


def _turn(session: AgentSession, body: dict[str, Any]) -> int | None:
    """The turn a reward is for: `turn` (a completion's 0-based index in the session), or the
    completion `completion_id` (choice `index`, default 0); None: the episode's reward."""
    made = session.client.completions
    if "completion_id" in body:
        cid, index = body["completion_id"], body.get("index", 0)
        for k, rec in enumerate(made):
            if rec.id == f"{cid}-{index}":
                return k
        raise _ApiError(
            400, f"completion_id={cid!r} (choice {index}) was not made in this session; send the id of one of its "
            "chat completions", param="completion_id",
        )  # fmt: skip
    if "turn" not in body:
        return None
    turn = body["turn"]
    if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn < len(made):
        raise _ApiError(
            400, f"turn={turn!r} must be the 0-based index of one of this session's {len(made)} completions so far "
            '(in the order made): {"reward": 0.5, "turn": 0}', param="turn",
        )  # fmt: skip
    return turn


def _wire(completion: Any) -> dict[str, Any]:
    """The completion as JSON: the `openai` type's dump, or the ChatObject's dict without `openai`."""
    try:
        return completion.model_dump(mode="json")
    except TypeError:
        return completion.model_dump()


def _error(e: _ApiError, stats: dict[str, int]) -> web.Response:
    if e.status == 400:
        stats["bad_requests"] += 1
    body = {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": None}}
    return web.json_response(body, status=e.status)
