"""One supervised inference server, run as a task of a Slurm job step.

    python -m arealite.launcher.serve --config RUN_DIR/config.yaml --run-dir RUN_DIR --backend builtin

The task index is `--index`, else $SLURM_PROCID: tasks 0 .. n_servers-1 are the policy servers,
the rest distillation teachers (`distill.teacher_path`). A server binds to this node's address
on a free port, and once it answers `/health` its `host:port` is published in
`RUN_DIR/servers/<server|teacher>-<i>.addr`, where the trainer job reads it. A dead server is
restarted on the same address up to `launcher.max_server_restarts` times; after that this
process exits 1 with a message naming the server, which ends the job step.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from arealite import backends
from arealite.config import GRPOConfig, load_config
from arealite.launcher.launch_args import exit_code
from arealite.launcher.server_cmd import server_command, teacher_server_command
from arealite.launcher.signals import signals_ignored
from arealite.launcher.supervision import SupervisedServer, record_process
from arealite.utils import net

POLL_INTERVAL = 0.5


def address_file(run_dir: str, index: int, role: str = "server") -> str:
    """Where server (or teacher) `index` publishes its address for the trainer."""
    return os.path.join(run_dir, "servers", f"{role}-{index}.addr")


def _publish(path: str, addr: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(addr + "\n")
    os.replace(tmp, path)  # readers never see a half-written address


def serve(config: GRPOConfig, run_dir: str, backend: str, index: int) -> None:
    """Start task `index`'s server, publish its address once healthy, supervise it until killed."""
    n = config.launcher.n_servers
    role, index = ("server", index) if index < n else ("teacher", index - n)
    command = server_command if role == "server" else teacher_server_command
    name = f"{role}-{index}"
    record_process(run_dir, f"supervisor:{name}", os.getpid())
    host = socket.gethostbyname(socket.gethostname())
    port = net.free_ports(1, host)[0]
    server = SupervisedServer(
        name=name,
        cmd=command(config, host, port, backend),
        host=host,
        port=port,
        log_path=os.path.join(run_dir, "logs", f"{name}.log"),
        max_restarts=config.launcher.max_server_restarts,
        start_timeout=config.launcher.server_start_timeout,
        on_start=lambda n, pid, addr: record_process(run_dir, n, pid, addr),
    )
    try:
        server.start()
        server.wait_healthy()
        _publish(address_file(run_dir, index, role), server.addr)
        while True:
            time.sleep(POLL_INTERVAL)
            server.check()
    finally:
        with signals_ignored():
            server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m arealite.launcher.serve", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the run's resolved config.yaml")
    p.add_argument("--run-dir", required=True, help="the run directory (logs, addresses)")
    p.add_argument("--backend", required=True, choices=sorted(backends.ENGINE_NAMES))
    p.add_argument("--index", type=int, default=None, help="server index; default $SLURM_PROCID")
    a = p.parse_args(argv)
    index = a.index if a.index is not None else int(os.environ.get("SLURM_PROCID", "0"))
    config = load_config(["--config", a.config], GRPOConfig, script_sections=True)

    def run() -> int:
        serve(config, a.run_dir, a.backend, index)
        return 0

    return exit_code(run, failed="run failed", interrupted=f"server-{index}: {{}} received; server stopped")


if __name__ == "__main__":
    sys.exit(main())
