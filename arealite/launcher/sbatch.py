"""The two sbatch scripts of a Slurm launch: the servers job and the trainer job.

Servers: one job step of `n_servers` tasks (plus one per distillation teacher the launcher
serves), each a supervised server (`python -m arealite.launcher.serve`) that publishes its
address once healthy. Trainer: `srun torchrun` with one task per node over `trainer_nodes`
nodes; it waits for every address, exports `AREAL_LLM_SERVER_ADDRS` (and
`AREAL_TEACHER_SERVER_ADDRS`), and rendezvous on the job's first node.
"""

from __future__ import annotations

import os
import shlex
import sys

from arealite import backends
from arealite.config import GRPOConfig
from arealite.launcher.process import with_package_path
from arealite.launcher.server_cmd import n_teachers
from arealite.utils import net


def _header(config: GRPOConfig, role: str, run_dir: str) -> list[str]:
    launcher = config.launcher
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=arealite-{role}-{config.experiment_name}-{config.trial_name}",
        f"#SBATCH --output={run_dir}/logs/slurm-{role}.out",
    ]
    if launcher.slurm_partition:
        lines.append(f"#SBATCH --partition={launcher.slurm_partition}")
    return lines


def _preamble(config: GRPOConfig, cwd: str) -> list[str]:
    return [
        "set -euo pipefail",
        f"cd {shlex.quote(cwd)}",
        # The same arealite as the launcher's, whatever the compute node's default path.
        f"export PYTHONPATH={shlex.quote(with_package_path(None)['PYTHONPATH'])}",
    ]


def servers_script(
    config: GRPOConfig,
    backend: str,
    run_dir: str,
    cwd: str,
    python: str = sys.executable,
    *,
    gpus_visible: bool = False,
) -> str:
    """The sbatch script that runs the setup commands, then every server as one job step; GPUs
    per task when the servers take them (`backends.uses_gpus`; `gpus_visible`: the submitting host's)."""
    launcher = config.launcher
    lines = _header(config, "servers", run_dir)
    tasks = launcher.n_servers + n_teachers(config)
    lines += [f"#SBATCH --ntasks={tasks}", f"#SBATCH --cpus-per-task={launcher.cpus_per_server}"]
    if backends.uses_gpus(backend, gpus_visible):
        lines.append(f"#SBATCH --gpus-per-task={launcher.gpus_per_server}")
    lines += [f"#SBATCH {arg}" for arg in launcher.slurm_sbatch_args]
    lines += _preamble(config, cwd)
    lines += list(launcher.setup_commands)
    serve = [
        python, "-m", "arealite.launcher.serve", "--config", os.path.join(run_dir, "config.yaml"),
        "--run-dir", run_dir, "--backend", backend,
    ]  # fmt: skip
    # --kill-on-bad-exit: a server out of restarts ends the step, and so the job.
    lines.append("srun --kill-on-bad-exit=1 " + shlex.join(serve))
    return "\n".join(lines) + "\n"


def _wait_for_addresses(n_servers: int, run_dir: str, timeout: float, teacher_count: int = 0) -> list[str]:
    addr_dir = shlex.quote(os.path.join(run_dir, "servers"))
    servers = " ".join(f"{addr_dir}/server-{i}.addr" for i in range(n_servers))
    teachers = " ".join(f"{addr_dir}/teacher-{i}.addr" for i in range(teacher_count))
    lines = [
        "# Wait until every server has published its address (it does once /health answers).",
        f"deadline=$((SECONDS + {int(timeout)}))",
        f"until ls {servers} {teachers} >/dev/null 2>&1; do",
        "  if [ $SECONDS -ge $deadline ]; then",
        f'    echo "servers did not publish their addresses in {addr_dir} within {int(timeout)}s" >&2; exit 1',
        "  fi",
        "  sleep 1",
        "done",
        f"export {net.SERVER_ADDRS_ENV}=$(cat {servers} | paste -sd, -)",
    ]
    if teachers:
        lines.append(f"export {net.TEACHER_ADDRS_ENV}=$(cat {teachers} | paste -sd, -)")
    return lines


def trainer_script(
    config: GRPOConfig,
    backend: str,
    run_dir: str,
    cwd: str,
    script: str,
    args: list[str],
    python: str = sys.executable,
    *,
    gpus_visible: bool = False,
) -> str:
    """The sbatch script that runs SCRIPT under `srun torchrun` across `trainer_nodes` nodes, a
    GPU per rank when the servers take GPUs (as `servers_script`)."""
    launcher = config.launcher
    nodes = launcher.trainer_nodes
    per_node = launcher.n_trainers // nodes
    lines = _header(config, "trainer", run_dir)
    lines += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1"]
    lines.append(f"#SBATCH --cpus-per-task={per_node * launcher.cpus_per_trainer}")
    if backends.uses_gpus(backend, gpus_visible):
        lines.append(f"#SBATCH --gpus-per-node={per_node}")
    lines += [f"#SBATCH {arg}" for arg in launcher.slurm_sbatch_args]
    lines += _preamble(config, cwd)
    lines += _wait_for_addresses(launcher.n_servers, run_dir, launcher.server_start_timeout + 600, n_teachers(config))
    lines += [
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"export MASTER_PORT=$({shlex.quote(python)} -m arealite.utils.net free-port)",
    ]
    torchrun = [
        python, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={per_node}",
        "--master-addr=$MASTER_ADDR", "--master-port=$MASTER_PORT", "--node-rank=$SLURM_NODEID", script, *args,
    ]  # fmt: skip
    record = (
        f'printf \'{{"name": "torchrun-node-%s", "pid": %s, "host": "%s", "addr": ""}}\\n\' '
        f'"$SLURM_NODEID" "$$" "$(hostname)" >> {shlex.quote(os.path.join(run_dir, "processes.jsonl"))}'
    )
    # The per-node variables ($SLURM_NODEID) must expand in each task, not in this script.
    inner = record + "; exec " + " ".join(_quote_keeping_vars(a) for a in torchrun)
    lines.append("srun --kill-on-bad-exit=1 bash -c " + shlex.quote(inner))
    return "\n".join(lines) + "\n"


def _quote_keeping_vars(arg: str) -> str:
    """Shell-quote `arg`, leaving a `$NAME` in `--flag=$NAME` to expand."""
    if "=$" in arg and arg.startswith("--"):
        flag, var = arg.split("=", 1)
        return f'{flag}="{var}"'
    return shlex.quote(arg)
