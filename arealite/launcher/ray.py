"""Ray launcher: servers and trainer ranks as Ray actors in one placement group.

    python -m arealite.launcher.ray SCRIPT --config CFG.yaml [key=value ...]

Joins the cluster at `launcher.ray_address` (or $RAY_ADDRESS), else starts a local one on
loopback. One placement group holds a bundle per server (`cpus_per_server` CPUs, plus
`gpus_per_server` GPUs for SGLang) and per trainer rank (`cpus_per_trainer` CPUs, plus one
GPU for SGLang runs). Each server actor supervises its server process on its node (restarts
on the same address, as the local launcher does); each trainer actor runs one rank of SCRIPT
with the torchrun variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
Logs go to `<run_dir>/logs/` (the run directory must be on a filesystem every node sees).
Actors get this process's AREAL*, OMP_*, NCCL_*, TORCH*, HF_* and similar variables.
Distillation teachers (`distill.teacher_path`) run as server actors too, in bundles after the
trainers', and reach the ranks as AREAL_TEACHER_SERVER_ADDRS, as under the local launcher.
Any failure (a server out of restarts, a rank exiting non-zero, an actor dying) tears
everything down and exits non-zero.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from arealite import backends
from arealite.config import GRPOConfig
from arealite.launcher.launch_args import LaunchArgs, run_launcher
from arealite.launcher.local import POLL_INTERVAL
from arealite.launcher.process import ManagedProcess, describe_exit, exit_status, run_setup_commands, with_package_path
from arealite.launcher.server_cmd import n_teachers, server_command, teacher_server_command
from arealite.launcher.signals import reclaim_signals, signals_ignored
from arealite.launcher.supervision import LaunchError, SupervisedServer, log, prepare_run_dir, record_process
from arealite.utils import net

# Driver variables every actor gets: Ray workers start from their raylet's environment, not
# this process's, so settings a user exports for the run must be carried over explicitly.
FORWARDED_ENV_PREFIXES = (
    "AREAL",
    "OMP_",
    "MKL_",
    "NCCL_",
    "GLOO_",
    "TORCH",
    "TRITON_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "WANDB_",
)


def forwarded_env() -> dict[str, str]:
    """The variables of this process that actors inherit (see FORWARDED_ENV_PREFIXES), plus PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    env["PYTHONPATH"] = with_package_path(None)["PYTHONPATH"]  # workers import this checkout's arealite
    return env


@ray.remote
class ServerActor:
    """Runs and supervises one inference server on the node it is placed on."""

    def __init__(
        self, config: GRPOConfig, index: int, backend: str, run_dir: str, host: str | None, role: str = "server"
    ) -> None:
        """`role`: server (a policy server) | teacher (a distillation teacher, `distill.teacher_path`)."""
        self.name = f"{role}-{index}"
        host = host or ray.util.get_node_ip_address()
        record_process(run_dir, f"actor:{self.name}", os.getpid())
        port = net.free_ports(1, host)[0]
        launcher = config.launcher
        command = teacher_server_command if role == "teacher" else server_command
        self.server = SupervisedServer(
            name=self.name,
            cmd=command(config, host, port, backend),
            host=host,
            port=port,
            log_path=os.path.join(run_dir, "logs", f"{self.name}.log"),
            max_restarts=launcher.max_server_restarts,
            start_timeout=launcher.server_start_timeout,
            on_start=lambda name, pid, addr: record_process(run_dir, name, pid, addr),
        )
        self.server.start()

    def addr(self) -> str:
        return self.server.addr

    def check(self) -> tuple[bool, int, str | None]:
        """(healthy, restarts so far, failure message or None) after one supervision step."""
        try:
            self.server.check()
        except LaunchError as e:
            return False, self.server.restarts, str(e)
        return self.server.healthy, self.server.restarts, None

    def stop(self) -> None:
        self.server.stop()


@ray.remote
class TrainerActor:
    """Runs one trainer rank as a child process on the node it is placed on."""

    def __init__(self, rank: int, run_dir: str, host: str | None) -> None:
        self.rank = rank
        self.run_dir = run_dir
        self.host = host or ray.util.get_node_ip_address()
        self.proc: ManagedProcess | None = None
        record_process(run_dir, f"actor:trainer-{rank}", os.getpid())

    def node(self) -> str:
        return self.host

    def free_port(self) -> int:
        return net.free_ports(1, self.host)[0]

    def start(self, cmd: list[str], env: dict[str, str], cwd: str) -> int:
        log_path = os.path.join(self.run_dir, "logs", f"trainer-{self.rank}.log")
        self.proc = ManagedProcess(f"trainer-{self.rank}", cmd, log_path, dict(os.environ, **env), cwd=cwd)
        self.proc.start()
        record_process(self.run_dir, f"trainer-{self.rank}", self.proc.pid or -1)
        return self.proc.pid or -1

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def placement_bundles(config: GRPOConfig, backend: str, cluster_gpus: bool) -> list[dict[str, float]]:
    """One bundle per server, then one per trainer rank, then one per teacher server (as a
    server's); GPUs when the servers take them (`backends.uses_gpus`, with the cluster's GPUs)."""
    launcher = config.launcher
    gpu = backends.uses_gpus(backend, cluster_gpus)
    server = {"CPU": launcher.cpus_per_server, **({"GPU": launcher.gpus_per_server} if gpu else {})}
    trainer = {"CPU": launcher.cpus_per_trainer, **({"GPU": 1} if gpu else {})}
    servers = [dict(server) for _ in range(launcher.n_servers + n_teachers(config))]
    return (
        servers[: launcher.n_servers]
        + [dict(trainer) for _ in range(launcher.n_trainers)]
        + servers[launcher.n_servers :]
    )


class RayRun:
    """One launch on a Ray cluster."""

    def __init__(self, args: LaunchArgs) -> None:
        self.args = args
        self.config = args.config
        self.run_dir = os.path.abspath(self.config.run_dir)
        self.started_cluster = False
        self.pg = None
        self.servers: list = []
        self.teachers: list = []
        self.teacher_addrs: list[str] = []
        self.trainers: list = []
        self.nodes: list[str] = []  # each rank's node address
        self.restarts = [0] * (self.config.launcher.n_servers + n_teachers(self.config))  # per server, teacher
        self.on_gpus = False  # servers and trainer ranks get GPUs (placement_bundles)
        self.call_timeout = self.config.launcher.ray_call_timeout

    def _get(self, refs, what: str):
        """ray.get within launcher.ray_call_timeout (Ray can otherwise wait forever); an actor
        that died or hung becomes a LaunchError naming `what`."""
        try:
            return ray.get(refs, timeout=self.call_timeout)
        except ray.exceptions.GetTimeoutError as e:
            raise LaunchError(f"{what}: no answer within launcher.ray_call_timeout={self.call_timeout:g}s") from e
        except ray.exceptions.RayActorError as e:
            raise LaunchError(f"{what}: an actor died: {e}") from e

    def connect(self) -> str:
        """Join the configured cluster, or start a local one; the host servers bind to."""
        address = self.config.launcher.ray_address or os.environ.get("RAY_ADDRESS", "")
        runtime_env = {"env_vars": forwarded_env()}
        if address:
            _check_reachable(address)
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
            return ""  # each actor binds to its own node's address
        launcher = self.config.launcher
        servers = launcher.n_servers + n_teachers(self.config)
        needed = servers * launcher.cpus_per_server + launcher.n_trainers * launcher.cpus_per_trainer
        # An explicit CPU count: Ray otherwise sizes the node from the machine and a placement
        # group that does not fit waits forever without a word.
        ray.init(
            address="local",  # a new cluster, never one that `ray start` left on this machine
            num_cpus=max(needed, os.cpu_count() or 1),
            include_dashboard=False,
            log_to_driver=False,
            runtime_env=runtime_env,
            _node_ip_address="127.0.0.1",
        )
        self.started_cluster = True
        return "127.0.0.1"

    def reserve(self, backend: str) -> None:
        launcher = self.config.launcher
        cluster_gpus = ray.cluster_resources().get("GPU", 0) > 0
        self.on_gpus = backends.uses_gpus(backend, cluster_gpus)
        bundles = placement_bundles(self.config, backend, cluster_gpus)
        self.pg = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=launcher.server_start_timeout)
        except ray.exceptions.GetTimeoutError as e:
            raise LaunchError(
                f"the Ray cluster cannot place {bundles} within {launcher.server_start_timeout:.0f}s; it has "
                f"{ray.available_resources()} free. Lower launcher.cpus_per_* or n_*, or add nodes"
            ) from e

    def _in_bundle(self, actor_cls, index: int, num_cpus: int, num_gpus: int):
        """`actor_cls` placed in bundle `index`, using that bundle's whole reservation."""
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=index)
        return actor_cls.options(num_cpus=num_cpus, num_gpus=num_gpus, scheduling_strategy=strategy)

    def start_servers(self, backend: str, host: str) -> list[str]:
        launcher = self.config.launcher
        gpus = launcher.gpus_per_server if self.on_gpus else 0
        for i in range(launcher.n_servers):
            actor = self._in_bundle(ServerActor, i, launcher.cpus_per_server, gpus).remote(
                self.config, i, backend, self.run_dir, host or None
            )
            self.servers.append(actor)
        first = launcher.n_servers + launcher.n_trainers  # the teachers' bundles follow the trainers'
        for i in range(n_teachers(self.config)):
            actor = self._in_bundle(ServerActor, first + i, launcher.cpus_per_server, gpus).remote(
                self.config, i, backend, self.run_dir, host or None, "teacher"
            )
            self.teachers.append(actor)
        log(f"started {launcher.n_servers} {backend} server actor(s), {len(self.teachers)} teacher(s); waiting")
        deadline = time.monotonic() + launcher.server_start_timeout + self.call_timeout
        while True:
            states = self._get([s.check.remote() for s in self.servers + self.teachers], "server start")
            for _, _, failure in states:
                if failure:
                    raise LaunchError(failure)
            if all(healthy for healthy, _, _ in states):
                self.teacher_addrs = self._get([s.addr.remote() for s in self.teachers], "teacher addresses")
                return self._get([s.addr.remote() for s in self.servers], "server addresses")
            if time.monotonic() > deadline:
                raise LaunchError("servers did not become healthy in time")
            time.sleep(0.5)

    def start_trainers(self, backend: str, host: str, addrs: list[str]) -> None:
        launcher = self.config.launcher
        n = launcher.n_trainers
        for rank in range(n):
            index = launcher.n_servers + rank
            actor = self._in_bundle(TrainerActor, index, launcher.cpus_per_trainer, 1 if self.on_gpus else 0)
            self.trainers.append(actor.remote(rank, self.run_dir, host or None))
        nodes = self.nodes = self._get([t.node.remote() for t in self.trainers], "trainer placement")
        master_port = self._get(self.trainers[0].free_port.remote(), "trainer rank 0")
        cmd = [sys.executable, self.args.script, *self.args.trainer_args]
        starts = []
        for rank, (actor, node) in enumerate(zip(self.trainers, nodes)):
            same_node = [r for r in range(n) if nodes[r] == node]
            env = {
                net.SERVER_ADDRS_ENV: ",".join(addrs),
                "RANK": str(rank), "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(same_node.index(rank)), "LOCAL_WORLD_SIZE": str(len(same_node)),
                "MASTER_ADDR": nodes[0], "MASTER_PORT": str(master_port),
            }  # fmt: skip
            if self.teacher_addrs:
                env[net.TEACHER_ADDRS_ENV] = ",".join(self.teacher_addrs)
            starts.append(actor.start.remote(cmd, env, os.getcwd()))
        pids = self._get(starts, "trainer start")
        log(f"trainer ranks started (pids {pids}); servers {addrs}")

    def supervise(self) -> int:
        """Until every rank has exited: keep servers alive; 0, or the first failing rank's status."""
        launcher = self.config.launcher
        while True:
            codes = self.poll_trainers()
            for rank, code in enumerate(codes):
                if code is not None and code != 0:
                    log(f"trainer rank {rank} {describe_exit(code)}; stopping the run")
                    return exit_status(code)
            if all(code == 0 for code in codes):
                log("all trainer ranks exited with code 0")
                return 0
            states = self._get([s.check.remote() for s in self.servers + self.teachers], "server check")
            n = launcher.n_servers
            for i, (_healthy, restarts, failure) in enumerate(states):
                if failure:
                    raise LaunchError(failure)
                if restarts > self.restarts[i]:
                    self.restarts[i] = restarts
                    name = f"server-{i}" if i < n else f"teacher-{i - n}"
                    log(f"{name} died and was restarted on its address ({restarts} of {launcher.max_server_restarts})")
            time.sleep(POLL_INTERVAL)

    def poll_trainers(self) -> list[int | None]:
        """Each rank's exit code (None while it runs); a rank whose actor died or stopped
        answering (its node lost) raises a LaunchError naming the rank and its node."""
        refs = [t.poll.remote() for t in self.trainers]
        ray.wait(refs, num_returns=len(refs), timeout=self.call_timeout)
        codes = []
        for rank, ref in enumerate(refs):  # a lost rank first: the others fail because of it
            try:
                codes.append(ray.get(ref, timeout=0))
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e:
                lost = "stopped answering" if isinstance(e, ray.exceptions.GetTimeoutError) else "died"
                raise LaunchError(
                    f"lost trainer rank {rank} on node {self.nodes[rank]}: its actor {lost} (the node or its "
                    f"Ray daemons are gone?); relaunch with recover.mode=auto to resume from the last checkpoint"
                ) from e
        return codes

    def run(self) -> int:
        prepare_run_dir(self.run_dir, self.config)
        try:
            host = self.connect()
            reclaim_signals()
            backend = _resolve_backend(self.config)
            run_setup_commands(self.config.launcher.setup_commands, os.path.join(self.run_dir, "logs"))
            self.reserve(backend)
            addrs = self.start_servers(backend, host)
            self.start_trainers(backend, host, addrs)
            return self.supervise()
        finally:
            with signals_ignored():
                self.teardown()

    def teardown(self) -> None:
        """Stop every child process through its actor, then the actors, the group and the cluster."""
        actors = self.trainers + self.servers + self.teachers
        stops = [a.stop.remote() for a in actors]
        try:
            ray.get(stops, timeout=self.call_timeout)
        except Exception as e:  # a dead actor's children got SIGTERM from PR_SET_PDEATHSIG
            log(f"while stopping actors: {type(e).__name__}: {e}")
        for a in actors:
            ray.kill(a)
        if self.pg is not None:
            remove_placement_group(self.pg)
        if ray.is_initialized():
            ray.shutdown()


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a cluster address nobody answers at (ray.init would retry for minutes)."""
    if address == "auto" or address.startswith("ray://") or ":" not in address:
        return
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError) as e:
        raise LaunchError(
            f"no Ray cluster answers at launcher.ray_address / RAY_ADDRESS = {address!r} ({e}); "
            "start one with `ray start --head`, or leave both empty to start a local cluster"
        ) from e


def _resolve_backend(config: GRPOConfig) -> str:
    """Like `server_cmd.resolve_backend`, but 'auto' looks at the cluster's GPUs, not this node's."""
    if config.server.backend != "auto":
        return config.server.backend
    return "sglang" if ray.cluster_resources().get("GPU", 0) > 0 else "builtin"


def main(argv: list[str] | None = None) -> int:
    """Run a launch on Ray from `SCRIPT --config CFG [overrides]`; returns the exit code."""
    return run_launcher(argv, "ray", lambda args: RayRun(args).run())


if __name__ == "__main__":
    # Run the imported module's main, so that Ray ships the actor classes by reference to
    # `arealite.launcher.ray` rather than pickling a copy of `__main__`.
    from arealite.launcher.ray import main as _main

    sys.exit(_main())
