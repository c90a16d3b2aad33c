"""Local launcher: inference servers and the trainer as child processes on this machine.

    python -m arealite.launcher.local SCRIPT --config CFG.yaml [key=value ...]

Starts `launcher.n_servers` servers on free loopback ports (SGLang on GPUs, else the
built-in server), waits for their `/health`, exports `AREAL_LLM_SERVER_ADDRS`, then runs
SCRIPT under torchrun with `launcher.n_trainers` processes (plain python for one). Logs go
to `<run_dir>/logs/`, the resolved config to `<run_dir>/config.yaml`, and every started
process to `<run_dir>/processes.jsonl`. A dead server is restarted on its address up to
`launcher.max_server_restarts` times; after that, or on Ctrl-C/SIGTERM, everything is
stopped. The exit code is the trainer's, or non-zero with a message naming what failed.
With a `judge:` whose `path` is set and `address` empty, one more built-in server serves the
judge model (never trained, never weight-synced) and `AREAL_JUDGE_SERVER_ADDRS` names it; with a
`distill:` whose `teacher_path` is set and `address` empty, `distill.n_servers` servers of the
servers' backend serve the teacher (likewise never synced; SGLang ones on the GPUs after the
trainer's) and `AREAL_TEACHER_SERVER_ADDRS` names them.
Every built-in server watches the launcher's pid (`AREALITE_PARENT_PID`, set to this process
whatever the inherited value) and stops once the launcher is gone, SIGKILL included.
"""

from __future__ import annotations

import os
import sys
import time

from arealite import backends
from arealite.config import ConfigError, GRPOConfig
from arealite.devices import check_gpus_for_ranks, requested_train_device
from arealite.launcher.launch_args import LaunchArgs, run_launcher
from arealite.launcher.process import ManagedProcess, describe_exit, exit_status, run_setup_commands, stop_all
from arealite.launcher.server_cmd import (
    judge_server_command,
    resolve_backend,
    server_command,
    teacher_server_command,
    visible_gpus,
)
from arealite.launcher.signals import signals_ignored
from arealite.launcher.supervision import SupervisedServer, log, prepare_run_dir, record_process
from arealite.utils import net
from arealite.utils.parent_watch import PARENT_PID_ENV

HOST = "127.0.0.1"
POLL_INTERVAL = 0.5  # seconds between supervision steps


def allocate_gpus(config: GRPOConfig, backend: str) -> tuple[list[list[str]], list[str]] | None:
    """GPU ids per server and for the trainer (where the backend's servers take GPUs:
    `backends.uses_gpus`), or None when the servers run on CPU."""
    gpus = visible_gpus()
    if not backends.uses_gpus(backend, bool(gpus)):
        return None
    launcher = config.launcher
    need = launcher.n_servers * launcher.gpus_per_server + launcher.n_trainers
    if len(gpus) < need:
        raise ConfigError(
            f"{launcher.n_servers} {backends.ENGINE_NAMES[backend]} servers x launcher.gpus_per_server="
            f"{launcher.gpus_per_server} plus "
            f"launcher.n_trainers={launcher.n_trainers} need {need} GPUs, but {len(gpus)} are visible; "
            "lower those values or set server.backend=builtin"
        )
    g = launcher.gpus_per_server
    per_server = [gpus[i * g : (i + 1) * g] for i in range(launcher.n_servers)]
    n_server_gpus = launcher.n_servers * g
    return per_server, gpus[n_server_gpus : n_server_gpus + launcher.n_trainers]


def allocate_teacher_gpus(config: GRPOConfig, backend: str) -> list[list[str]] | None:
    """GPU ids per SGLang teacher server, after the policy servers' and the trainer's; None on CPU."""
    distill = config.distill
    if backend != "sglang" or distill is None or not distill.teacher_path or distill.address:
        return None
    launcher, gpus, g = config.launcher, visible_gpus(), config.launcher.gpus_per_server
    first = launcher.n_servers * g + launcher.n_trainers
    if len(gpus) < first + distill.n_servers * g:
        raise ConfigError(
            f"distill.n_servers={distill.n_servers} SGLang teacher servers x launcher.gpus_per_server={g} need "
            f"{distill.n_servers * g} GPUs beyond the {first} of the policy servers and trainers, but {len(gpus)} "
            "are visible; lower distill.n_servers, or serve the teacher elsewhere and set distill.address"
        )
    return [gpus[first + i * g : first + (i + 1) * g] for i in range(distill.n_servers)]


def check_gpu_placement(config: GRPOConfig, backend: str, gpus: list[str]) -> None:
    """Refuse at launch what would die on the GPUs later, naming the fix (ConfigError).

    With built-in servers the trainer sees every visible GPU (`gpus`), one per rank, and the
    servers run on the first one. Then (1) more trainer ranks than GPUs is refused, and (2)
    so is `weight_update=distributed`: NCCL cannot put the server and trainer rank 0 of one
    broadcast group on the same GPU.
    """
    try:
        if backend != "builtin" or not gpus or requested_train_device() == "cpu":
            return  # SGLang: allocate_gpus counted the GPUs; no GPU or a CPU trainer: nothing to share
        check_gpus_for_ranks(config.launcher.n_trainers, len(gpus))
    except (RuntimeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    extra = config.server.extra_args
    server_on_cpu = "--device" in extra[:-1] and extra[extra.index("--device") + 1] == "cpu"
    if config.weight_update == "distributed" and not server_on_cpu:
        raise ConfigError(
            "weight_update=distributed needs the servers and the trainer's rank 0 on different GPUs, but the "
            f"built-in server runs on GPU {gpus[0]} beside the trainer (NCCL refuses two ranks of one group on "
            "one GPU). Set weight_update=disk, or run SGLang servers on GPUs of their own (server.backend=sglang)"
        )


def trainer_command(args: LaunchArgs, master_port: int) -> list[str]:
    """torchrun over `n_trainers` processes, or plain python for one."""
    n = args.config.launcher.n_trainers
    if n == 1:
        return [sys.executable, args.script, *args.trainer_args]
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(n), "--master-addr", HOST, "--master-port", str(master_port),
        args.script, *args.trainer_args,
    ]  # fmt: skip


def trainer_env(server_addrs: list[str], master_port: int, gpus: list[str] | None, threads: int = 1) -> dict[str, str]:
    env = {**os.environ, net.SERVER_ADDRS_ENV: ",".join(server_addrs)}
    # torch threads per trainer rank = its reserved CPUs (torchrun's default of 1 for several
    # ranks; a lone rank would take every core and, beside the servers, spin-wait on them:
    # the CPU main job ran more than twice as long with 2 threads on 2 cores shared with other
    # jobs, and the asynchronous one overlaps rollout and training only with a core each).
    # An OMP_NUM_THREADS already set wins.
    env.setdefault("OMP_NUM_THREADS", str(threads))
    # The same rendezvous variables torchrun sets, so a one-process run needs no special case.
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    env.update(MASTER_ADDR=HOST, MASTER_PORT=str(master_port))
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env


class LocalRun:
    """One launch: its servers, its trainer, and their supervision."""

    def __init__(self, args: LaunchArgs) -> None:
        self.args = args
        self.config = args.config
        self.run_dir = os.path.abspath(self.config.run_dir)
        self.log_dir = os.path.join(self.run_dir, "logs")
        self.servers: list[SupervisedServer] = []
        self.judges: list[SupervisedServer] = []  # servers of judge.path: no weight sync reaches them
        self.teachers: list[SupervisedServer] = []  # servers of distill.teacher_path: likewise
        self.teacher_gpus: list[list[str]] | None = None  # per SGLang teacher server (allocate_teacher_gpus)
        self.trainer: ManagedProcess | None = None

    @property
    def supervised(self) -> list[SupervisedServer]:
        return self.servers + self.judges + self.teachers

    def _record(self, name: str, pid: int, addr: str) -> None:
        record_process(self.run_dir, name, pid, addr)

    def start_servers(self, backend: str, gpus: list[list[str]] | None) -> None:
        launcher = self.config.launcher
        for i, port in enumerate(net.free_ports(launcher.n_servers, HOST)):
            env = dict(os.environ, **{PARENT_PID_ENV: str(os.getpid())})  # it stops once the launcher is gone
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i])
            if backend in backends.OMP_THREADED:  # torch threads = its reserved CPUs, as for the trainer (trainer_env)
                env.setdefault("OMP_NUM_THREADS", str(launcher.cpus_per_server))
            server = SupervisedServer(
                name=f"server-{i}",
                cmd=server_command(self.config, HOST, port, backend),
                host=HOST,
                port=port,
                log_path=os.path.join(self.log_dir, f"server-{i}.log"),
                max_restarts=launcher.max_server_restarts,
                start_timeout=launcher.server_start_timeout,
                env=env,
                on_start=self._record,
            )
            self.servers.append(server)
            server.start()
        judge = self.config.judge
        if judge is not None and judge.path and not judge.address:
            self.start_judge(net.free_ports(1, HOST, exclude={s.port for s in self.servers})[0])
        distill = self.config.distill
        if distill is not None and distill.teacher_path and not distill.address:
            self.start_teachers(backend, self.teacher_gpus)
        log(
            f"started {len(self.servers)} {backend} server(s), {len(self.judges)} judge(s) and {len(self.teachers)} "
            "teacher(s); waiting for /health"
        )
        while not all(s.healthy for s in self.supervised):
            for s in self.supervised:
                s.check()
            time.sleep(0.3)

    def start_judge(self, port: int) -> None:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            PARENT_PID_ENV: str(os.getpid()),
        }
        judge = SupervisedServer(
            name="judge-0",
            cmd=judge_server_command(self.config, HOST, port),
            host=HOST,
            port=port,
            log_path=os.path.join(self.log_dir, "judge-0.log"),
            max_restarts=self.config.launcher.max_server_restarts,
            start_timeout=self.config.launcher.server_start_timeout,
            env=env,
            on_start=self._record,
        )
        self.judges.append(judge)
        judge.start()

    def start_teachers(self, backend: str, gpus: list[list[str]] | None) -> None:
        n = self.config.distill.n_servers if self.config.distill else 0
        ports = net.free_ports(n, HOST, exclude={s.port for s in self.supervised})
        for i, port in enumerate(ports):
            env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i])
            if backend == "builtin":
                env.setdefault("OMP_NUM_THREADS", str(self.config.launcher.cpus_per_server))
            teacher = SupervisedServer(
                name=f"teacher-{i}",
                cmd=teacher_server_command(self.config, HOST, port, backend),
                host=HOST,
                port=port,
                log_path=os.path.join(self.log_dir, f"teacher-{i}.log"),
                max_restarts=self.config.launcher.max_server_restarts,
                start_timeout=self.config.launcher.server_start_timeout,
                env=env,
                on_start=self._record,
            )
            self.teachers.append(teacher)
            teacher.start()

    def start_trainer(self, gpus: list[str] | None) -> None:
        master_port = net.free_ports(1, HOST, exclude={s.port for s in self.supervised})[0]
        addrs = [s.addr for s in self.servers]
        env = trainer_env(addrs, master_port, gpus, self.config.launcher.cpus_per_trainer)
        if self.judges:
            env[net.JUDGE_ADDRS_ENV] = ",".join(s.addr for s in self.judges)
        if self.teachers:
            env[net.TEACHER_ADDRS_ENV] = ",".join(s.addr for s in self.teachers)
        self.trainer = ManagedProcess(
            "trainer", trainer_command(self.args, master_port), os.path.join(self.log_dir, "trainer.log"), env
        )
        self.trainer.start(echo=True)
        self._record("trainer", self.trainer.pid or -1, "")
        log(f"trainer started (pid {self.trainer.pid}, {self.config.launcher.n_trainers} process(es)); servers {addrs}")

    def supervise(self) -> int:
        """Until the trainer exits: keep servers alive; the trainer's exit status."""
        assert self.trainer is not None
        while True:
            code = self.trainer.poll()
            if code is not None:
                log(f"trainer {describe_exit(code)}")
                return exit_status(code)
            for s in self.supervised:
                s.check()
            time.sleep(POLL_INTERVAL)

    def run(self) -> int:
        backend = resolve_backend(self.config.server)
        check_gpu_placement(self.config, backend, visible_gpus())  # before anything starts
        prepare_run_dir(self.run_dir, self.config)
        gpus = allocate_gpus(self.config, backend)
        self.teacher_gpus = allocate_teacher_gpus(self.config, backend)
        try:
            run_setup_commands(self.config.launcher.setup_commands, self.log_dir)
            self.start_servers(backend, gpus[0] if gpus else None)
            self.start_trainer(gpus[1] if gpus else None)
            return self.supervise()
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the trainer and every server; never interrupted by a second signal."""
        with signals_ignored():
            procs = ([self.trainer] if self.trainer else []) + [s.process for s in self.supervised]
            stop_all(procs)


def main(argv: list[str] | None = None) -> int:
    """Run a launch from the command line `SCRIPT --config CFG [overrides]`; returns the exit code."""
    return run_launcher(argv, "local", lambda args: LocalRun(args).run())


if __name__ == "__main__":
    sys.exit(main())
