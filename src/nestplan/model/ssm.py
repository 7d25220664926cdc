"""The Mamba-2 mixer's formulas: parameters, forward GEMMs, the SSD scan, saved activation bytes.

Mamba-2 (Dao & Gu 2024, "Transformers are SSMs", arXiv 2405.21060, section 7 "Mamba-2 architecture")
as Hugging Face ``modeling_nemotron_h`` (``NemotronHMamba2Mixer``) and Megatron-core
(``megatron/core/ssm/mamba_mixer.py``, ``MambaMixer``) build it. Notation: h hidden size, H heads, P
head dim, d = H P the inner width, G groups of B and C, N state size, K conv kernel, Q chunk size,
t tensor-parallel size, T tokens of a microbatch on one device.

* ``in_proj`` (h -> 2 d + 2 G N + H: z, x, B, C, dt), a depthwise causal conv1d of width K over
  x, B, C (``conv_dim = d + 2 G N`` channels, with a bias), the SSD scan, a gated RMSNorm of d
  weights (``norm(y) * silu(z)``), ``out_proj`` (d -> h); A_log, D and dt_bias: one per head. No
  projection biases (Megatron-core asserts ``not bias``; Nemotron-H's ``use_bias`` is false).
* Tensor parallelism (Megatron-core ``MambaMixer.__init__``): heads and groups split over tp (it
  asserts ``nheads % tp == 0`` and ``ngroups % tp == 0``): ``in_proj`` is column-parallel, ``out_proj``
  row-parallel, the conv, A_log, D, dt_bias and the gated norm's weight are split with their heads;
  only the block's own pre-norm is replicated. Sequence parallelism gathers the input before
  ``in_proj`` and reduce-scatters after ``out_proj``, as for attention.
"""

from __future__ import annotations

from dataclasses import dataclass

STATE_BYTES = 4        # SSD chunk states and the gated norm's rstd are fp32 (mamba_ssm ssd_combined.py)


@dataclass(frozen=True)
class Mamba2Shape:
    """Sizes of one Mamba-2 mixer (all layers of a model share them)."""

    num_heads: int        # H (HF ``mamba_num_heads``, Megatron ``--mamba-num-heads``)
    head_dim: int         # P (``mamba_head_dim``)
    state_size: int       # N (``ssm_state_size``, Megatron ``--mamba-state-dim``)
    groups: int           # G (``n_groups``, Megatron ``--mamba-num-groups``)
    conv_kernel: int      # K (``conv_kernel``)
    chunk_size: int       # Q (``chunk_size``): the SSD algorithm's block length
    conv_bias: bool = True

    @property
    def inner(self) -> int:
        """d = H P: the width of x, z and the scan's output."""
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the causal conv1d: x, B and C (d + 2 G N)."""
        return self.inner + 2 * self.groups * self.state_size

    @property
    def in_proj_width(self) -> int:
        """Output width of ``in_proj``: z, x, B, C and dt (2 d + 2 G N + H)."""
        return self.inner + self.conv_channels + self.num_heads


# ---------------------------------------------------------------- parameters
def mamba_params(m: Mamba2Shape, hidden: int) -> int:
    """Parameters of one mixer (its block's pre-norm aside): in_proj, conv weight (and bias),
    A_log, D and dt_bias per head, the gated norm's weight, out_proj (HF ``NemotronHMamba2Mixer``)."""
    in_proj = hidden * m.in_proj_width
    conv = m.conv_channels * m.conv_kernel + (m.conv_channels if m.conv_bias else 0)
    per_head = 3 * m.num_heads
    return in_proj + conv + per_head + m.inner + m.inner * hidden


# ---------------------------------------------------------------- FLOPs
def projection_shapes(m: Mamba2Shape, hidden: int, tp: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(n, k) of the forward GEMMs in_proj (column-parallel) and out_proj (row-parallel) on one of
    ``tp`` devices, for each token."""
    return (m.in_proj_width / tp, hidden), (hidden, m.inner / tp)


def ssd_gemm_shapes(m: Mamba2Shape, tokens: float, tp: int) -> list[tuple[float, float, float, float]]:
    """(m, n, k, count) of the SSD algorithm's batched products over ``tokens`` tokens on one of ``tp``
    devices (Dao & Gu 2024, section 6, with chunks of Q tokens; the kernels of mamba_ssm
    ops/triton/ssd_combined.py that Megatron-core and HF call):

    1. ``_bmm_chunk_fwd``: C B^T within each chunk, one Q x Q matrix per chunk and group (B and C are
       shared by a group's heads): Q x N @ N x Q;
    2. ``_chunk_scan_fwd``, diagonal blocks: (L o C B^T) X per chunk and head: Q x Q @ Q x P;
    3. ``_chunk_state_fwd``: each chunk's final state B^T X per head: N x Q @ Q x P;
    4. ``_chunk_scan_fwd``, off-diagonal blocks: C times the state entering the chunk: Q x N @ N x P.

    The full Q x Q rectangle of steps 1 and 2 is counted (the paper's count; the causal mask leaves
    about half of it for the kernel to skip). The state passing between chunks (step 3 of the paper,
    ``_state_passing_fwd``) is an elementwise recurrence over T / Q states: HBM traffic, costed in
    cost/ssm.py. FLOPs per token and head: 2 Q N G / H + 2 Q P + 4 N P.
    """
    q, n, p = m.chunk_size, m.state_size, m.head_dim
    chunks = tokens / q
    heads, groups = m.num_heads / tp, m.groups / tp
    return [(q, q, n, chunks * groups), (q, p, q, chunks * heads), (n, p, q, chunks * heads),
            (q, p, n, chunks * heads)]


def ssd_flops(m: Mamba2Shape, tokens: float, tp: int = 1) -> float:
    """Forward FLOPs of the SSD scan over ``tokens`` tokens on one of ``tp`` devices."""
    return sum(2.0 * a * b * c * count for a, b, c, count in ssd_gemm_shapes(m, tokens, tp))


# ---------------------------------------------------------------- activations
def mamba_saved_bytes(m: Mamba2Shape, tokens: float, tp: int, dtype_bytes: int) -> float:
    """Bytes one mixer keeps for its backward pass on one device, beyond its input (counted with the
    block's norm). The fused kernel (mamba_ssm ``mamba_split_conv1d_scan_combined``, Megatron-core's
    ``use_mamba_mem_eff_path``) saves the in_proj output (z, x, B, C, dt) and the scan's output
    before the gated norm, and the norm's reciprocal RMS per group (fp32); it recomputes the conv
    output and the chunk states in backward. out_proj saves its input (the gated norm's output).
    Per token: B (2 d + 2 G N + H + 2 d) / t + 4 G / t."""
    in_proj_out = m.in_proj_width
    scan_out = out_proj_in = m.inner
    per_token = dtype_bytes * (in_proj_out + scan_out + out_proj_in) + STATE_BYTES * m.groups
    return tokens * per_token / tp
