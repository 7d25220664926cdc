"""What a Mamba mixer's scan and its memory-bound kernels cost on one device.

The SSD scan (Dao & Gu 2024, arXiv 2405.21060, section 6) runs as the Triton kernels of mamba_ssm
``ops/triton/ssd_combined.py`` (``_chunk_cumsum_fwd``, ``_chunk_state_fwd``, ``_state_passing_fwd``,
``_bmm_chunk_fwd``, ``_chunk_scan_fwd``), which Megatron-core's MambaMixer and HF's NemotronHMamba2Mixer
call: four batched products (``ssd_gemms``, timed as GEMMs by cost/compute.py) and the HBM traffic
of their operands, the fp32 C B^T blocks and the fp32 chunk states (``ssd_scan_bytes``). Mamba-1's
selective scan (mamba_ssm csrc/selective_scan, Jamba) runs on the CUDA cores in fp32 with its states
on chip: a roofline of its FLOPs and its HBM traffic (``selective_scan_time``).
"""

from __future__ import annotations

from nestplan.hardware.accelerator import Accelerator
from nestplan.model.layers import Gemm, Shard
from nestplan.model.ssm import STATE_BYTES, Mamba1Shape, Mamba2Shape, MambaShape, scan_flops, ssd_gemm_shapes

# the SSD backward (mamba_ssm ``_mamba_chunk_scan_combined_bwd``) recomputes the chunk states
# (``_chunk_state_fwd`` and ``_state_passing_fwd`` again) before its gradient kernels: index of that
# product in ``ssd_gemms``
CHUNK_STATE_GEMM = 2
# the selective scan's backward (selective_scan_bwd_kernel) recomputes the states and runs the
# recurrence back, reading the forward's inputs and the output gradient and writing the inputs'
# gradients: twice the forward's work and traffic
SELECTIVE_SCAN_BACKWARD_RATIO = 2.0


def ssd_gemms(m: Mamba2Shape, shard: Shard) -> list[Gemm]:
    """The SSD scan's batched products on one device for one microbatch (model/ssm.py ``ssd_gemm_shapes``)."""
    return [Gemm(a, b, c, count) for a, b, c, count in ssd_gemm_shapes(m, shard.tokens, shard.tp)]


def ssd_scan_bytes(m: Mamba2Shape, shard: Shard) -> float:
    """HBM bytes the SSD kernels move in one forward pass on one device, per token (t: tp size):

    * x read twice (chunk state, chunk scan), B and C twice each (C B^T and the chunk state or
      scan), dt once, the output y written: B (3 d + 4 G N + H) / t;
    * C B^T, one fp32 Q x Q block per chunk and group, written and read: 2 x 4 G Q / t;
    * the chunk states, H P N fp32 per chunk: written by the chunk-state kernel, read and written by
      the state passing, read by the chunk scan: 4 x 4 H P N / (Q t).
    """
    B = shard.dtype_bytes
    operands = B * (3 * m.inner + 4 * m.groups * m.state_size + m.num_heads)
    blocks = 2 * STATE_BYTES * m.groups * m.chunk_size
    states = 4 * STATE_BYTES * m.inner * m.state_size / m.chunk_size
    return shard.tokens * (operands + blocks + states) / shard.tp


def selective_scan_time(acc: Accelerator, m: Mamba1Shape, shard: Shard) -> tuple[float, float]:
    """(forward, backward) seconds of Mamba-1's selective scan on one device: the slower of its fp32
    FLOPs (model/ssm.py ``scan_flops``) at the accelerator's fp32 peak (memory-bound alone where the
    catalog has none) and its HBM traffic: u, delta and z read and the output written (d each, over
    t), B and C read (2 N); backward ``SELECTIVE_SCAN_BACKWARD_RATIO`` times that."""
    traffic = shard.dtype_bytes * shard.tokens * (4 * m.inner / shard.tp + 2 * m.state_size)
    fp32 = acc.peak_flops.get("fp32")
    compute = scan_flops(m, shard.tokens, shard.tp) / fp32 if fp32 else 0.0
    forward = max(compute, acc.memory_time(traffic))
    return forward, SELECTIVE_SCAN_BACKWARD_RATIO * forward


def mamba_elementwise_bytes(m: MambaShape, shard: Shard) -> float:
    """HBM traffic of a Mamba mixer's memory-bound kernels in one forward pass on one device, in the
    activations' dtype over t = tp devices. Mamba-2: the causal conv1d with its SiLU over x, B and C
    (read, write: 2 (d + 2 G N) per token) and the gated RMSNorm (read y and z, write: 3 d). Mamba-1
    (Jamba): the conv1d with its SiLU over x (2 d) and the RMSNorms of dt, B and C (read, write:
    2 (R + 2 N), replicated); its z gating and D skip run inside the scan."""
    B, T, t = shard.dtype_bytes, shard.tokens, shard.tp
    if isinstance(m, Mamba1Shape):
        return B * T * (2 * m.inner / t + 2 * m.x_proj_width)
    return B * T * (2 * m.conv_channels + 3 * m.inner) / t
