"""The command line every launcher takes, `[launcher options] SCRIPT --config CFG.yaml
[key=value ...]`, and how a launch's outcome becomes the launcher's exit code.

Everything after SCRIPT is the trainer's own argv; the launcher parses it with the same
`load_config` the trainer will use, so both see one configuration (the sections a script adds
in its own config subclass are left to the script). Exit codes, the same for
every launcher: the run's own status; 1 when a process of the run failed (`LaunchError`); 2
for a bad command line or config (`ConfigError`); 128+N after signal N (SIGINT, SIGTERM).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

from arealite import backends
from arealite.config import ConfigError, GRPOConfig, load_config
from arealite.launcher.signals import Interrupted, raising_on_signals, received
from arealite.launcher.supervision import LaunchError, log

USAGE = "usage: python -m arealite.launcher.{name} {options}SCRIPT --config CFG.yaml [key=value ...]"
HELP = (
    "\nRuns SCRIPT in every trainer rank beside the inference servers the config asks for.\n"
    "Every config field, with its default and help: python -m arealite.launcher.{name} SCRIPT --help\n"
)


@dataclass
class LaunchArgs:
    script: str  # the training script to run in every trainer rank
    trainer_args: list[str]  # passed to the script unchanged: --config CFG and overrides
    config: GRPOConfig  # the resolved experiment config
    options: set[str]  # launcher flags given before SCRIPT, e.g. {"--dry-run"}


def parse_launch_args(argv: list[str], name: str, allowed_options: tuple[str, ...] = ()) -> LaunchArgs:
    """Split launcher flags, SCRIPT and the trainer's argv; load the config. Raises ConfigError."""
    options: set[str] = set()
    rest = list(argv)
    if rest and rest[0] in ("-h", "--help"):  # before SCRIPT: the launcher's own usage
        opts = "".join(f"[{o}] " for o in allowed_options)
        print(USAGE.format(name=name, options=opts) + HELP.format(name=name), end="", flush=True)
        raise SystemExit(0)
    while rest and rest[0].startswith("--"):
        if rest[0] not in allowed_options:
            opts = "".join(f"[{o}] " for o in allowed_options)
            raise ConfigError(f"unknown launcher option {rest[0]!r}\n" + USAGE.format(name=name, options=opts))
        options.add(rest.pop(0))
    if not rest:
        opts = "".join(f"[{o}] " for o in allowed_options)
        raise ConfigError("missing SCRIPT\n" + USAGE.format(name=name, options=opts))
    script, trainer_args = rest[0], rest[1:]
    if not os.path.isfile(script):
        raise ConfigError(f"training script {script!r} does not exist (cwd: {os.getcwd()})")
    # after SCRIPT, --help prints every config field and exits 0
    prog = f"python -m arealite.launcher.{name} {script}"
    config = backends.check(load_config(trainer_args, GRPOConfig, prog=prog, script_sections=True))
    return LaunchArgs(script=script, trainer_args=trainer_args, config=config, options=options)


def run_launcher(
    argv: list[str] | None,
    name: str,
    run: Callable[[LaunchArgs], int],
    stopped: str = "stopped everything",
    allowed_options: tuple[str, ...] = (),
) -> int:
    """A launcher's `main`: parse `argv` (default: sys.argv[1:]), `run` the launch, return the exit code.

    `name` is the launcher's module name (for the usage line); `stopped` says in the failure
    and signal messages what the launcher's cleanup did, e.g. "cancelled every job".
    """
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_launch_args(argv, name, allowed_options)
        return exit_code(lambda: run(args), failed=f"run failed, {stopped}", interrupted=f"{{}} received; {stopped}")
    except ConfigError as e:
        log(f"error: {e}")
        return 2


def exit_code(run: Callable[[], int], failed: str, interrupted: str) -> int:
    """`run()` with SIGINT/SIGTERM raising `Interrupted`; its status, 1 on LaunchError, 128+N on signal N
    (also when a library caught the Interrupted and raised its own error: `signals.received`).

    The LaunchError is logged as `failed: <error>`, the signal as `interrupted` with `{}`
    replaced by the signal's name. A ConfigError propagates to the caller.
    """
    try:
        with raising_on_signals():
            return run()
    except LaunchError as e:
        log(f"{failed}: {e}")
        return 1
    except Interrupted as e:
        log(interrupted.format(e))
        return 128 + e.signum
    except Exception as e:
        signum = received()  # the signal came as another error (signals.received)
        if signum is None:
            raise
        log(interrupted.format(f"{signal.Signals(signum).name} (as {type(e).__name__})"))
        return 128 + signum
