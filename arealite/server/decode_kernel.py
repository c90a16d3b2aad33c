"""The lean forward's decode attention on a CPU: decode_attention.c, compiled for the model's shape.

`load(head_dim, group)` compiles the C file with the system's C compiler (`$CC`, else `cc`),
once per source, shape, compiler and flags, into `$AREALITE_KERNEL_CACHE` (default
`~/.cache/arealite/kernels`), loads it with ctypes and returns a `DecodeAttention`; or returns
None, with the reason logged once, when there is no compiler, the head dim is not a power of
two in 8..256, the target's vectors are narrower than 256 bits (where it measured slower than
sdpa), or `AREALITE_DECODE_KERNEL=0`. The lean forward then uses sdpa (same results
to fp32 rounding; tests/server/test_decode_kernel.py compares them).

Why: at a few hundred running rows of a small model, sdpa's per-(row, head) overhead and its
reads of every row's padded columns cost about half of a decode step on a CPU; the kernel
attends each row over its own columns only (benchmarks/server_throughput.py). fp32 tensors
on the CPU only. With more than one torch thread the rows are split across a thread pool
(ctypes releases the GIL during the call).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
ENV_SWITCH = "AREALITE_DECODE_KERNEL"  # "0": never use the kernel
ENV_CACHE = "AREALITE_KERNEL_CACHE"
FLAGS = ("-O3", "-std=gnu11", "-shared", "-fPIC")
MIN_LANES = 8  # floats per vector (AVX and wider); with SSE2's 4 the kernel lost to sdpa at head_dim 64-128
ROWS_PER_THREAD = 64  # fewer rows per thread than this: not split (a pool hand-off costs ~100 us)

_loaded: dict[tuple[int, int, str, str], DecodeAttention | None] = {}
_told: set[str] = set()


class KernelUnavailable(RuntimeError):
    """The kernel cannot be used here; the message says why."""


def _cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "arealite" / "kernels")


def _cpu_id() -> bytes:
    """What -march=native depends on: a library built for one CPU is never loaded on another
    (a cache directory shared across a cluster's nodes stays safe)."""
    try:
        with open("/proc/cpuinfo") as f:
            return b"\n".join(line.encode() for line in f if line.startswith(("model name", "flags", "Features")))
    except OSError:
        return f"{platform.machine()} {platform.processor()}".encode()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc") or shutil.which("clang")


def _compile(compiler: str, head_dim: int, group: int) -> Path:
    """The shared library for this shape, compiled now unless cached."""
    source = SOURCE.read_bytes()
    defines = (f"-DHEAD_DIM={head_dim}", f"-DGROUP={group}")
    errors = []
    for arch in (("-march=native",), ()):  # some compilers or targets reject -march=native
        flags = (*FLAGS, *arch, *defines)
        key = hashlib.sha256(b"\0".join([source, compiler.encode(), _cpu_id(), *map(str.encode, flags)]))
        path = _cache_dir() / f"decode_attention_d{head_dim}_g{group}_{key.hexdigest()[:16]}.so"
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        # compile aside, then rename: concurrent builds (test workers, several servers) are safe
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        try:
            command = [compiler, *flags, "-o", tmp, str(SOURCE)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            os.unlink(tmp)
            raise KernelUnavailable(f"running {compiler} failed: {e}") from e
        if done.returncode == 0:
            os.replace(tmp, path)
            return path
        os.unlink(tmp)
        errors.append(f"{compiler} {' '.join(flags)}: {done.stderr.strip()[-500:]}")
    raise KernelUnavailable("compiling decode_attention.c failed: " + "; ".join(errors))


def build(head_dim: int, group: int) -> DecodeAttention:
    """Compile (or take from the cache) and load the kernel for this shape; raises
    KernelUnavailable naming the reason and the fix."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        raise KernelUnavailable(f"{ENV_SWITCH}=0")
    if head_dim < 8 or head_dim > 256 or head_dim & (head_dim - 1):
        raise KernelUnavailable(f"head_dim {head_dim} is not a power of two in 8..256")
    if group < 1:
        raise KernelUnavailable(f"{group} query heads per key/value head")
    compiler = _compiler()
    if compiler is None:
        raise KernelUnavailable("no C compiler: install gcc or clang, or set CC")
    path = _compile(compiler, head_dim, group)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise KernelUnavailable(f"loading {path} failed: {e}") from e
    lanes = lib.decode_attention_lanes()
    if lanes < MIN_LANES:
        raise KernelUnavailable(
            f"{compiler} targets {lanes * 32}-bit vectors here; below {MIN_LANES * 32} the kernel is slower than sdpa"
        )
    return DecodeAttention(lib, head_dim, group)


def load(head_dim: int, group: int) -> DecodeAttention | None:
    """`build`, once per shape and setting; None (the reason logged once) where it cannot."""
    memo = (head_dim, group, os.environ.get(ENV_SWITCH, "1"), os.environ.get("CC", ""))
    if memo not in _loaded:
        try:
            _loaded[memo] = build(head_dim, group)
        except KernelUnavailable as e:
            _loaded[memo] = None
            if str(e) not in _told:
                _told.add(str(e))
                logger.warning("lean forward: decode attention falls back to sdpa (%s)", e)
    return _loaded[memo]


_P, _I = ctypes.c_void_p, ctypes.c_int64


class DecodeAttention:
    """Writes each row's new key/value into the cache and attends its queries over its own columns."""

    def __init__(self, lib: ctypes.CDLL, head_dim: int, group: int):
        self.head_dim, self.group = head_dim, group
        self._fn = lib.decode_attention
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [_P, _I, _P, _I, _P, _I, _P, _P, _I, _I, _I, _P, _I, _I, _I, ctypes.c_float, _P]
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    def __call__(
        self,
        q: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        keys_t: torch.Tensor,
        values: torch.Tensor,
        pos: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """q [B, H, D], k_new/v_new [B, H_kv, D] (heads and dims contiguous within a row);
        keys_t [rows, H_kv, D, cols] and values [rows, H_kv, cols, D] (one layer, contiguous);
        pos [>= B] int64: row b's cached tokens (its new token's column). Returns [B, H * D] fp32."""
        batch, heads, d = q.shape
        kv_heads = k_new.shape[1]
        for name, t in (("q", q), ("k_new", k_new), ("v_new", v_new)):
            if t.dtype != torch.float32 or t.device.type != "cpu" or t.stride(2) != 1 or t.stride(1) != d:
                raise ValueError(f"decode attention: {name} must be fp32 on the CPU, [head, dim] contiguous per row")
        if not (keys_t.is_contiguous() and values.is_contiguous() and keys_t.stride()[:2] == values.stride()[:2]):
            raise ValueError("decode attention: the cache's keys and values must be contiguous with equal row strides")
        if d != self.head_dim or heads != kv_heads * self.group:
            raise ValueError(f"decode attention: built for head_dim {self.head_dim}, group {self.group}")
        if pos.dtype != torch.int64 or not pos.is_contiguous():
            raise ValueError(f"decode attention: pos must be contiguous int64, not {pos.dtype}")
        out = torch.empty(batch, heads * d, dtype=torch.float32)
        args = (
            q.data_ptr(),
            q.stride(0),
            k_new.data_ptr(),
            k_new.stride(0),
            v_new.data_ptr(),
            v_new.stride(0),
            keys_t.data_ptr(),
            values.data_ptr(),
            keys_t.stride(0),
            keys_t.stride(1),
            keys_t.shape[-1],
            pos.data_ptr(),
        )
        tail = (kv_heads, scale, out.data_ptr())
        threads = min(torch.get_num_threads(), batch // ROWS_PER_THREAD)
        if threads <= 1:
            results = [self._fn(*args, 0, batch, *tail)]
        else:
            if self._pool_size < threads:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(threads, thread_name_prefix="decode-attention")
                self._pool_size = threads
            bounds = [batch * i // threads for i in range(threads + 1)]
            jobs = [self._pool.submit(self._fn, *args, bounds[i], bounds[i + 1], *tail) for i in range(threads)]
            results = [j.result() for j in jobs]
        if any(r != 0 for r in results):
            raise MemoryError("decode attention: no memory for the scores")
        return out
