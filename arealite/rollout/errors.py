"""Typed errors of the rollout client.

Each carries the server address and the request id it concerns, never the request payload
(prompts can be long and private), in the manner of httpx's exception hierarchy.
"""

from __future__ import annotations


class RolloutError(RuntimeError):
    """Base class: something went wrong talking to an inference server."""

    def __init__(self, message: str, address: str = "", rid: str = "") -> None:
        self.address = address
        self.rid = rid
        where = ", ".join(p for p in (f"server={address}" if address else "", f"request={rid}" if rid else "") if p)
        super().__init__(f"{message} ({where})" if where else message)


class ServerUnavailable(RolloutError):
    """No healthy server could take the request (all down, or one stayed down past the timeout)."""


class GenerationError(RolloutError):
    """A server refused or failed a /generate call in a way that retrying will not fix (4xx,
    an abort with an error status, or a malformed response)."""


class WeightUpdateError(RolloutError):
    """A weight-update or group-init call failed on a server."""


class TransientServerError(RolloutError):
    """A connection error, timeout or 5xx: worth retrying, possibly on another server."""
