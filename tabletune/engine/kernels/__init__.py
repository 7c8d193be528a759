"""The engine's Triton kernels (GPU; Triton's interpreter runs them in tests): ``attention`` (split-KV, with RoPE
and the cache write fused in), ``rope``, ``norms`` and ``gemm`` (cuBLAS or one split-K kernel), behind
``triton_ops.TritonOps``. Importing this package imports nothing heavy."""
