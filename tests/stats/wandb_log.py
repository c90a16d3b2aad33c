"""Reading back the history of an offline W&B run from its transaction log (`run-<id>.wandb`).

wandb >= 0.19 has no Python reader for it (its Go core writes it), so this decodes the
framing by hand: a 7-byte header (`:W&B`, a 2-byte magic, a version byte), then LevelDB log
blocks of 32 KiB whose chunks carry a 7-byte header (CRC 4, little-endian length 2, type 1:
full, first, middle, last). Each reassembled record is a `wandb_internal_pb2.Record`,
parsed with wandb's own protobuf classes.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import time

_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(data: bytes):
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        room = _BLOCK - (pos % _BLOCK)
        if room < 7:  # a block's tail too short for a header is padding
            pos += room
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind in (_FULL, _FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (_FULL, _LAST):
            yield pending


def wandb_history(run_root: str, timeout: float = 60.0) -> dict[int, dict[str, object]]:
    """{step: {key: value}} of every `run.log` call in the offline run under `run_root`.

    Waits (up to `timeout` s) for the log's `exit` record: W&B's core process may still be
    writing when `finish()` has returned on a busy machine."""
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout
    while True:
        (path,) = glob.glob(os.path.join(run_root, "wandb", "offline-run-*", "run-*.wandb"))
        with open(path, "rb") as f:
            data = f.read()
        assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
        records = []
        for raw in _records(data):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds:
            break
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout}s; records: {kinds}"
        time.sleep(0.5)
    out: dict[int, dict[str, object]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            out.setdefault(int(items.pop("_step")), {}).update(items)
    return out
