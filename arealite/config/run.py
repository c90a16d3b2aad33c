"""How a run is launched, recorded and resumed: processes and resources (`LauncherConfig`),
per-step statistics (`StatsLoggerConfig`) and checkpoints (`RecoverConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arealite.config.fields import check_choices, check_positive, setting
from arealite.config.loading import ConfigError

WandbMode = Literal["disabled", "offline", "online"]
RecoverMode = Literal["auto", "disabled", "resume"]


@dataclass
class LauncherConfig:
    """Process allocation for the launchers."""

    n_servers: int = setting(1, "inference servers")
    n_trainers: int = setting(1, "trainer processes (torchrun nproc_per_node)")
    gpus_per_server: int = setting(1, "ignored by the built-in server on CPU")
    server_start_timeout: float = setting(180.0, "seconds a server may take to answer /health before the launch fails")
    max_server_restarts: int = setting(0, "restarts per server before the run stops")
    setup_commands: list[str] = setting(
        factory=list,
        help="shell commands run once before servers start, as written: command-line overrides do not reach "
        "them (a warm start reads its --config file; edit that, or override launcher.setup_commands)",
    )
    cpus_per_server: int = setting(
        1,
        "CPUs reserved per server (Ray bundle, Slurm --cpus-per-task; local built-in server: its torch "
        "threads unless OMP_NUM_THREADS is set)",
    )
    cpus_per_trainer: int = setting(
        1,
        "CPUs reserved per trainer rank (Ray bundle, Slurm --cpus-per-task; local: its torch threads unless "
        "OMP_NUM_THREADS is set)",
    )
    ray_address: str = setting(
        "", 'Ray cluster to join ("auto" or host:port); empty: $RAY_ADDRESS, else start a local one'
    )
    ray_call_timeout: float = setting(
        60.0,
        "seconds the Ray launcher waits for one actor call (a trainer rank's poll, a server's check) before "
        "it calls the actor's node lost and stops the run; lower notices a lost host sooner, but must cover "
        "an answer from a busy node",
    )
    trainer_nodes: int = setting(1, "Slurm nodes the trainer ranks span (n_trainers split evenly across them)")
    slurm_partition: str = setting("", "sbatch --partition; empty: the cluster's default partition")
    slurm_sbatch_args: list[str] = setting(factory=list, help='extra sbatch options, e.g. ["--account=rl"]')

    def __post_init__(self) -> None:
        check_positive("launcher", "n_servers", self.n_servers)
        check_positive("launcher", "n_trainers", self.n_trainers)
        check_positive("launcher", "max_server_restarts", self.max_server_restarts, allow_zero=True)
        check_positive("launcher", "trainer_nodes", self.trainer_nodes)
        check_positive("launcher", "ray_call_timeout", self.ray_call_timeout)
        if self.n_trainers % self.trainer_nodes:
            raise ConfigError(
                f"launcher.n_trainers={self.n_trainers} does not split evenly over "
                f"launcher.trainer_nodes={self.trainer_nodes}; make n_trainers a multiple of trainer_nodes"
            )


@dataclass
class StatsLoggerConfig:
    """Where per-step statistics go."""

    jsonl: bool = setting(True, "write <run_dir>/stats.jsonl")
    tensorboard: bool = setting(False, "also write <run_dir>/tensorboard/ (needs the tensorboard package)")
    wandb_mode: WandbMode = setting("disabled", "whether and how wandb logs the run")
    progress_bar: bool = setting(
        True,
        "a tqdm bar over training steps on the main process, its postfix the step, reward, held-out pass@1 "
        "(the latest evaluation) and seconds per step; off: one short line per step with the same numbers",
    )
    print_stats: bool = setting(
        False,
        "also print every step's full stats as one `[stats] key=value ...` line (they always go to stats.jsonl, "
        "and to tensorboard / wandb when on), and under the bar the step's events (weight versions confirmed). "
        "verl and TRL print every metric at each logging step by default; arealite keeps the console to the bar",
    )
    plot: bool = setting(True, "write <run_dir>/plots.png at the end of the run (needs matplotlib)")
    samples_shown: int = setting(
        3,
        "completions of the trained batch shown in the console, samples.jsonl, tensorboard and wandb at each "
        "evaluation (`StatsLogger.log_samples`); 0: none",
    )

    def __post_init__(self) -> None:
        check_choices(self, "stats_logger")


@dataclass
class RecoverConfig:
    """Checkpoints for recovery (`arealite.recover`): what a crashed run resumes from."""

    mode: RecoverMode = setting(
        "auto", "auto: resume when a checkpoint exists | disabled | resume: a checkpoint must exist"
    )
    freq_steps: int = setting(0, "save every this many steps (and after the last); 0: only after the last step")
    keep_last: int = setting(
        2, "checkpoints kept on disk (older ones are deleted); >= 2 leaves one to fall back to if the newest is damaged"
    )
    checksum: bool = setting(
        True,
        "record each checkpoint file's SHA-256 and verify it before loading (one extra read at save and "
        "load); sizes are always checked",
    )

    def __post_init__(self) -> None:
        check_choices(self, "recover")
        check_positive("recover", "freq_steps", self.freq_steps, allow_zero=True)
        check_positive("recover", "keep_last", self.keep_last)
