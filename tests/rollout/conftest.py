"""Built-in inference servers for rollout tests: real processes on free loopback ports."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from arealite.server.process import ServerProcess, launch_server_process

SERVER_ARGS = ("--torch-threads", "1", "--log-level", "warning", "--skip-server-warmup")


def start_server(model_path: str, log_dir: Path, port: int | None = None, extra_args: tuple = ()) -> ServerProcess:
    log = log_dir / f"server-{port or 'new'}-{len(list(log_dir.iterdir()))}.log"
    return launch_server_process(model_path, port=port, extra_args=SERVER_ARGS + tuple(extra_args), log_path=str(log))


def start_servers(model_path: str, log_dir: Path, n: int) -> list[ServerProcess]:
    """`n` servers started side by side; all are stopped if any fails to start."""
    with ThreadPoolExecutor(n) as pool:
        futures = [
            pool.submit(
                launch_server_process, model_path, None, SERVER_ARGS, None, 120, str(log_dir / f"server-{i}.log")
            )
            for i in range(n)
        ]
    servers, errors = [], []
    for future in futures:
        try:
            servers.append(future.result())
        except Exception as e:
            errors.append(e)
    if errors:
        for s in servers:
            s.stop()
        raise errors[0]
    return servers


def kill(server: ServerProcess) -> None:
    """SIGKILL: the server dies mid-request, as a crashed machine would."""
    server.proc.kill()
    server.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def two_servers(tiny_model_dir, tmp_path_factory):
    """Shared by the rollout tests; each test module resets the servers' weight version."""
    servers = start_servers(tiny_model_dir, tmp_path_factory.mktemp("server-logs"), 2)
    yield servers
    for s in servers:
        s.stop()
