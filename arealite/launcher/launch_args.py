"""The command line every launcher takes: `[launcher options] SCRIPT --config CFG [key=value ...]`.

Everything after SCRIPT is the trainer's own argv; the launcher parses it with the same
`load_config` the trainer will use, so both see one configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from arealite.config import ConfigError, GRPOConfig, load_config

USAGE = "usage: python -m arealite.launcher.{name} {options}SCRIPT --config CFG.yaml [key=value ...]"


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
    config = load_config(trainer_args, GRPOConfig)
    return LaunchArgs(script=script, trainer_args=trainer_args, config=config, options=options)
