"""Moving the trainer's weights to the inference servers: `WeightSync` (docs/architecture.md §6).

`sync.py` orders the steps; `buckets.py` gathers and broadcasts parameters; `distributed.py`
keeps a broadcast group alive across server failures; `group.py` is the stand-alone process
group between trainer rank 0 and the servers (the built-in server uses it too).
"""

from arealite.weight_sync.distributed import WeightSyncError
from arealite.weight_sync.sync import WeightSync

__all__ = ["WeightSync", "WeightSyncError"]
