"""Triton kernels behind `arealite.algo.advantages`. Import these modules only through
its `*_triton` functions: they import triton at module level, this package does not."""
