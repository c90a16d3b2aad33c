"""The Triton kernels compile for an H200 (sm_90) without a GPU.

The interpreter (TRITON_INTERPRET=1) accepts code that the compiler rejects (loop-carried
type changes, non-power-of-two shapes, ...), so the numeric tests in test_advantages.py do
not prove the GPU path builds. This compiles every kernel through to a cubin in a fresh
process without the interpreter (ptxas ships with triton; no GPU or driver is needed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from arealite.algo.kernels import broadcast, gae, group_norm, whiten

    def build(fn, sig, constexprs, warps=4):
        src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        assert kernel.asm["cubin"], fn.__name__
        print("compiled", fn.__name__)

    for ptr, acc in (("*fp32", tl.float32), ("*fp64", tl.float64)):
        io = dict(rew_ptr=ptr, val_ptr=ptr, mask_ptr="*u8", cu_ptr="*i32", adv_ptr=ptr, ret_ptr=ptr, n_seqs="i32",
                  n_tokens="i32")
        rows, block = gae._tile(1024 * 1024, 1024)
        (g_hi, g_lo), (d_hi, d_lo) = gae._split(0.99), gae._split(0.99 * 0.95)
        build(gae._gae_kernel, io, dict(GAMMA_HI=g_hi, GAMMA_LO=g_lo, DECAY_HI=d_hi, DECAY_LO=d_lo,
                                        ROWS=rows, BLOCK=block, ACC=acc, INTERPRETED=False),
              warps=gae._NUM_WARPS)
        for mode in (0, 1, 2):
            build(group_norm._group_norm_kernel,
                  dict(x_ptr=ptr, out_ptr=ptr, n_groups="i32", group_size="i32", std_div="i32", eps="fp32"),
                  dict(MODE=mode, GROUPS=256, BLOCK_G=16, ACC=acc))
        build(whiten._tile_stats_kernel, dict(x_ptr=ptr, m_ptr="*u8", part_ptr=ptr, n="i32"),
              dict(BLOCK=whiten._BLOCK, ACC=acc))
        build(whiten._normalize_kernel, dict(x_ptr=ptr, m_ptr="*i64", stats_ptr=ptr, out_ptr=ptr, n="i32"),
              dict(SHIFT_MEAN=False, BLOCK=whiten._BLOCK, ACC=acc))
    build(broadcast._broadcast_kernel, dict(v_ptr="*fp32", m_ptr="*u8", out_ptr="*fp32", n_rows="i32", n_cols="i32"),
          dict(ROWS=broadcast._ROWS, BLOCK_T=broadcast._BLOCK_T))
    print("ALL OK")
    """
)


@pytest.mark.timeout(240)
def test_kernels_compile_for_sm90_without_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=220)
    if "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("this triton install has no ptxas to build cubins")
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
