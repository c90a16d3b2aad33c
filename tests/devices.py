"""Where tests put trainer ranks: one GPU each when there are enough, else the CPU.

A test that starts N trainer ranks on a machine with fewer than N GPUs runs them on the CPU
(gloo) through `AREALITE_TRAIN_DEVICE=cpu`; the library itself refuses such a launch (see
`arealite.devices`), which tests/launcher/test_local.py checks.
"""

from __future__ import annotations

import torch

from arealite.devices import DEVICE_ENV


def train_device_env(ranks: int) -> dict[str, str]:
    """Environment for a subprocess that starts `ranks` trainer ranks on this machine."""
    return {DEVICE_ENV: "cpu"} if torch.cuda.device_count() < ranks else {}
