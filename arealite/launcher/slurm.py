"""Slurm launcher: the servers and the trainer as two sbatch jobs, watched until the end.

    python -m arealite.launcher.slurm [--dry-run] SCRIPT --config CFG.yaml [key=value ...]

Writes `<run_dir>/slurm/servers.sbatch` and `trainer.sbatch` (see `sbatch.py`), submits
both, then polls them with `scontrol`, streaming the trainer's output to stdout and the
servers' supervision messages to stderr. When the trainer job ends, the servers job is
cancelled and the trainer's exit code returned. If the servers job ends first (a server out
of restarts), or on Ctrl-C/SIGTERM, both jobs are cancelled and the exit code is non-zero.
`--dry-run` writes and prints the scripts without submitting. The run directory must be on
a filesystem every node sees.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time

from arealite.launcher.launch_args import LaunchArgs, run_launcher
from arealite.launcher.process import LaunchError, tail
from arealite.launcher.sbatch import servers_script, trainer_script
from arealite.launcher.server_cmd import resolve_backend, visible_gpus
from arealite.launcher.signals import signals_ignored
from arealite.launcher.supervision import log, prepare_run_dir

POLL_INTERVAL = 1.0
FINISHED = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        raise LaunchError(
            f"{cmd[0]} not found: install the Slurm client, or pass --dry-run to only write scripts"
        ) from e
    if out.returncode != 0:
        raise LaunchError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def job_state(job_id: str) -> tuple[str, int | None]:
    """(JobState, exit code or None while it runs) from `scontrol show job`."""
    fields = dict(kv.split("=", 1) for kv in _run(["scontrol", "show", "job", "-o", job_id]).split() if "=" in kv)
    state = fields.get("JobState", "UNKNOWN")
    if state not in FINISHED:
        return state, None
    code, signum = (int(x) for x in fields.get("ExitCode", "1:0").split(":"))
    if signum:
        return state, 128 + signum
    return state, code if (code or state == "COMPLETED") else 1  # cancelled or failed without a code


def _finished(job_id: str) -> bool:
    """True once the job has ended; a job Slurm no longer knows (purged) has ended too."""
    try:
        return job_state(job_id)[1] is not None
    except LaunchError:
        return True


class LogFollower:
    """Copies what was appended to a file since the last call onto a stream."""

    def __init__(self, path: str, stream, only_prefix: str = "") -> None:
        self.path, self.stream, self.only_prefix, self.offset = path, stream, only_prefix, 0

    def follow(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        cut = data.rfind(b"\n") + 1  # whole lines only
        self.offset += cut
        for line in data[:cut].decode("utf-8", errors="replace").splitlines(keepends=True):
            if line.startswith(self.only_prefix):
                self.stream.write(line)
        self.stream.flush()


class SlurmRun:
    """One launch through sbatch."""

    def __init__(self, args: LaunchArgs) -> None:
        self.args = args
        self.config = args.config
        self.run_dir = os.path.abspath(self.config.run_dir)
        self.jobs: dict[str, str] = {}  # role -> job id

    def write_scripts(self) -> dict[str, str]:
        """Write the resolved config and both sbatch scripts; {role: script path}."""
        prepare_run_dir(self.run_dir, self.config, subdirs=("logs", "slurm", "servers"))
        for stale in glob.glob(os.path.join(self.run_dir, "servers", "*.addr")):
            os.remove(stale)  # a previous launch's addresses would mislead the trainer
        # 'auto', and whether the backend's servers take GPUs, decide on this host: submit from a node like
        # the compute nodes, or set server.backend.
        backend, gpus = resolve_backend(self.config.server), bool(visible_gpus())
        cwd = os.getcwd()
        script = os.path.abspath(self.args.script)
        texts = {
            "servers": servers_script(self.config, backend, self.run_dir, cwd, gpus_visible=gpus),
            "trainer": trainer_script(
                self.config, backend, self.run_dir, cwd, script, self.args.trainer_args, gpus_visible=gpus
            ),
        }
        paths = {}
        for role, text in texts.items():
            paths[role] = os.path.join(self.run_dir, "slurm", f"{role}.sbatch")
            with open(paths[role], "w") as f:
                f.write(text)
        return paths

    def submit(self, paths: dict[str, str]) -> None:
        self.jobs["servers"] = _run(["sbatch", "--parsable", paths["servers"]]).strip().split(";")[0]
        log(f"submitted servers job {self.jobs['servers']} ({paths['servers']})")
        # after: the trainer starts no earlier than the servers (it then waits for their addresses).
        dep = f"--dependency=after:{self.jobs['servers']}"
        self.jobs["trainer"] = _run(["sbatch", "--parsable", dep, paths["trainer"]]).strip().split(";")[0]
        log(f"submitted trainer job {self.jobs['trainer']} ({paths['trainer']})")

    def watch(self) -> int:
        """Poll both jobs until the trainer ends (its exit code) or the servers job fails."""
        logs = os.path.join(self.run_dir, "logs")
        followers = [
            LogFollower(os.path.join(logs, "slurm-trainer.out"), sys.stdout),
            LogFollower(os.path.join(logs, "slurm-servers.out"), sys.stderr, only_prefix="[launcher]"),
        ]
        while True:
            for f in followers:
                f.follow()
            state, code = job_state(self.jobs["trainer"])
            if code is not None:
                for f in followers:
                    f.follow()
                log(f"trainer job {self.jobs['trainer']} ended: {state}, exit code {code}")
                return code
            state, code = job_state(self.jobs["servers"])
            if code is not None:
                out = os.path.join(logs, "slurm-servers.out")
                raise LaunchError(
                    f"servers job {self.jobs['servers']} ended ({state}, exit code {code}) while the trainer "
                    f"was running\n--- last lines of {out} ---\n{tail(out)}"
                )
            time.sleep(POLL_INTERVAL)

    def cancel(self, timeout: float = 90.0) -> None:
        """scancel both jobs and wait until Slurm reports them finished (their processes gone)."""
        if not self.jobs:
            return
        subprocess.run(["scancel", *self.jobs.values()], capture_output=True, timeout=60)
        deadline = time.monotonic() + timeout
        pending = set(self.jobs.values())
        while pending and time.monotonic() < deadline:
            pending = {j for j in pending if not _finished(j)}
            time.sleep(0.5)
        if pending:
            log(f"jobs {sorted(pending)} still not finished {timeout:.0f}s after scancel")

    def run(self, dry_run: bool) -> int:
        paths = self.write_scripts()
        if dry_run:
            for path in paths.values():
                print(f"# ---- {path} (sbatch {path}) ----")
                with open(path) as f:
                    print(f.read())
            log("--dry-run: scripts written, nothing submitted")
            return 0
        if shutil.which("sbatch") is None:
            raise LaunchError("sbatch not found: install the Slurm client, or pass --dry-run to only write scripts")
        try:
            self.submit(paths)
            return self.watch()
        finally:
            with signals_ignored():
                self.cancel()


def main(argv: list[str] | None = None) -> int:
    """Run a launch through Slurm from `[--dry-run] SCRIPT --config CFG [overrides]`; the exit code."""
    return run_launcher(
        argv,
        "slurm",
        lambda args: SlurmRun(args).run(dry_run="--dry-run" in args.options),
        stopped="cancelled every job",
        allowed_options=("--dry-run",),
    )


if __name__ == "__main__":
    sys.exit(main())
