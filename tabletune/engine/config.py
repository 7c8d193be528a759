"""The engine's one configuration: ``EngineConfig``, with the kernels' own ``KernelConfig`` inside it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KernelConfig:
    """How the model's ops run. ``use_triton``: the Triton kernels (default: on CUDA), else the PyTorch ops;
    ``pdl``: programmatic dependent launch where the GPU has it; ``split_k``: the Triton split-K GEMM is a
    candidate of the GEMM chooser (off: cuBLAS only)."""
    use_triton: bool | None = None
    pdl: bool = True
    split_k: bool = True


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8
    max_len: int = 2048  # cache positions per sequence (prompt + output + k_max + 2)
    k_max: int = 7
    temperature: float = 0.0
    buckets: tuple[int, ...] = ()  # default: padding.default_buckets(max_num_seqs)
    ks: tuple[int, ...] = ()  # k values with a graph; default 0..k_max
    use_graphs: bool | None = None  # default: on CUDA
    # The target's prompt forward as a CUDA graph per prompt length up to this many tokens, captured after the second
    # prompt of that length (at most prefill.PREFILL_GRAPHS lengths; others run eager). Eager, a 32-token prefill of
    # the 8B shape is host-bound by its ~500 launches (36-45 ms on an H200). 0: always eager.
    prefill_graph_max_len: int = 512
    # Also capture the draft-position graphs and a verify graph per step graph, so that a policy can read the drafted
    # tokens' signals and end rows' drafts between positions (``SpecEngine.draft_position`` / ``verify_drafted``).
    split_steps: bool = False
    kernels: KernelConfig = field(default_factory=KernelConfig)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.k_max < 0 or self.temperature < 0 or self.prefill_graph_max_len < 0:
            raise ValueError(f"bad engine config {self}")
        if self.max_len < self.k_max + 3:
            raise ValueError(f"max_len {self.max_len} too small for k_max {self.k_max}")
        if any(k < 0 or k > self.k_max for k in self.ks):
            raise ValueError(f"ks {self.ks} outside 0..k_max={self.k_max}")
