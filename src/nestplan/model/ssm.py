"""The Mamba mixers' formulas: parameters, forward GEMMs, the scan, saved activation bytes.

Two mixers: Mamba-2 (``Mamba2Shape``: Nemotron-H) and the original selective SSM (``Mamba1Shape``:
Jamba); each function below takes either.

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

STATE_BYTES = 4  # SSD chunk states and the gated norm's rstd are fp32 (mamba_ssm ssd_combined.py)
# FLOPs of the selective scan per token, channel and state (Mamba-1): discretise (delta A, exp), the
# input (delta B u), the update (A-bar h + B-bar u) and the readout (C h): Megatron-LM's
# num_floating_point_operations counts 7 d N per token for a Mamba layer's scan (megatron/training/
# training.py, mamba_layer_flops); Gu & Dao 2023 (arXiv 2312.00752) section 3.3.2 give its O(B L D N) work
SELECTIVE_SCAN_FLOPS = 7


@dataclass(frozen=True)
class Mamba2Shape:
    """Sizes of one Mamba-2 mixer (all layers of a model share them)."""

    num_heads: int  # H (HF ``mamba_num_heads``, Megatron ``--mamba-num-heads``)
    head_dim: int  # P (``mamba_head_dim``)
    state_size: int  # N (``ssm_state_size``, Megatron ``--mamba-state-dim``)
    groups: int  # G (``n_groups``, Megatron ``--mamba-num-groups``)
    conv_kernel: int  # K (``conv_kernel``)
    chunk_size: int  # Q (``chunk_size``): the SSD algorithm's block length
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


@dataclass(frozen=True)
class Mamba1Shape:
    """Sizes of one selective-SSM mixer (Mamba, Gu & Dao 2023, arXiv 2312.00752) as Jamba builds it
    (HF modeling_jamba ``JambaMambaMixer``): in_proj (h -> 2 d: x and the gate z), a depthwise causal
    conv1d of width K over x, x_proj (d -> R + 2 N: dt, B, C) with an RMSNorm on each of dt, B and C
    (Jamba's), dt_proj (R -> d, with a bias), A_log (d x N) and D (d), out_proj (d -> h), no projection
    biases. Tensor parallelism as vLLM's MambaMixer splits it (in_proj and dt_proj column-parallel,
    x_proj and out_proj row-parallel): channels split over tp, the R + 2 N x_proj outputs all-reduced."""

    inner: int  # d = mamba_expand x hidden
    state_size: int  # N (mamba_d_state)
    conv_kernel: int  # K (mamba_d_conv)
    dt_rank: int  # R (mamba_dt_rank; "auto": ceil(hidden / 16))
    conv_bias: bool = True

    @property
    def x_proj_width(self) -> int:
        """Output width of x_proj: dt, B and C (R + 2 N)."""
        return self.dt_rank + 2 * self.state_size


MambaShape = Mamba2Shape | Mamba1Shape


# ---------------------------------------------------------------- parameters
def mamba_params(m: MambaShape, hidden: int) -> int:
    """Parameters of one mixer (its block's pre-norm aside). Mamba-2: in_proj, conv weight (and bias),
    A_log, D and dt_bias per head, the gated norm's weight, out_proj (HF ``NemotronHMamba2Mixer``).
    Mamba-1 (Jamba): in_proj, conv, x_proj, dt_proj and its bias, A_log, D, the dt/B/C norms, out_proj."""
    if isinstance(m, Mamba1Shape):
        d, n = m.inner, m.state_size
        conv = d * m.conv_kernel + (d if m.conv_bias else 0)
        projections = hidden * 2 * d + d * m.x_proj_width + m.dt_rank * d + d + d * hidden
        return projections + conv + d * n + d + m.x_proj_width
    in_proj = hidden * m.in_proj_width
    conv = m.conv_channels * m.conv_kernel + (m.conv_channels if m.conv_bias else 0)
    per_head = 3 * m.num_heads
    return in_proj + conv + per_head + m.inner + m.inner * hidden


# ---------------------------------------------------------------- FLOPs
def projection_shapes(m: MambaShape, hidden: int, tp: int) -> list[tuple[float, float, str]]:
    """(n, k, split) of the mixer's forward GEMMs on one of ``tp`` devices, for each token, in_proj
    ("column"-parallel) and out_proj ("row"-parallel) first; Mamba-1's x_proj and dt_proj after them
    ("local": on the device's channels, x_proj's partial sums all-reduced over tp)."""
    if isinstance(m, Mamba1Shape):
        return [
            (2 * m.inner / tp, hidden, "column"),
            (hidden, m.inner / tp, "row"),
            (m.x_proj_width, m.inner / tp, "local"),
            (m.inner / tp, m.dt_rank, "local"),
        ]
    return [(m.in_proj_width / tp, hidden, "column"), (hidden, m.inner / tp, "row")]


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
    return [(q, q, n, chunks * groups), (q, p, q, chunks * heads), (n, p, q, chunks * heads), (q, p, n, chunks * heads)]


def scan_flops(m: MambaShape, tokens: float, tp: int = 1) -> float:
    """Forward FLOPs of the scan over ``tokens`` tokens on one of ``tp`` devices: the SSD algorithm's
    products (Mamba-2), the selective scan's 7 d N per token (Mamba-1, ``SELECTIVE_SCAN_FLOPS``)."""
    if isinstance(m, Mamba1Shape):
        return SELECTIVE_SCAN_FLOPS * tokens * m.inner * m.state_size / tp
    return sum(2.0 * a * b * c * count for a, b, c, count in ssd_gemm_shapes(m, tokens, tp))


# ---------------------------------------------------------------- activations
def mamba_saved_bytes(m: MambaShape, tokens: float, tp: int, dtype_bytes: int) -> float:
    """Bytes one mixer keeps for its backward pass on one device, beyond its input (counted with the
    block's norm). Mamba-1 (Jamba): ``selective_saved_bytes``. Mamba-2: the fused kernel (mamba_ssm ``mamba_split_conv1d_scan_combined``, Megatron-core's
    ``use_mamba_mem_eff_path``) saves the in_proj output (z, x, B, C, dt) and the scan's output
    before the gated norm, and the norm's reciprocal RMS per group (fp32); it recomputes the conv
    output and the chunk states in backward. out_proj saves its input (the gated norm's output).
    Per token: B (2 d + 2 G N + H + 2 d) / t + 4 G / t."""
    if isinstance(m, Mamba1Shape):
        return selective_saved_bytes(m, tokens, tp, dtype_bytes)
    in_proj_out = m.in_proj_width
    scan_out = out_proj_in = m.inner
    per_token = dtype_bytes * (in_proj_out + scan_out + out_proj_in) + STATE_BYTES * m.groups
    return tokens * per_token / tp


def selective_saved_bytes(m: Mamba1Shape, tokens: float, tp: int, dtype_bytes: int) -> float:
    """What Jamba's mixer keeps for backward on one device, beyond its input (HF JambaMambaMixer's
    kernel path: causal_conv1d_fn, the dt/B/C norms and selective_scan_fn, each autograd function
    keeping its inputs): the in_proj output (x and z, 2 d), the conv output (d: x_proj's and the
    scan's input), x_proj's output (R + 2 N: the norms' inputs) and the normed dt, B, C (R + 2 N),
    dt_proj's output (delta, d), the scan's gated output (d: out_proj's input), per token over t, and
    the three norms' fp32 reciprocal RMS. The scan's per-chunk last states are left out (d 2 N fp32
    per 2048 tokens: under 1% of the rest)."""
    elements = 5 * m.inner / tp + 2 * m.x_proj_width
    return tokens * (dtype_bytes * elements + STATE_BYTES * 3)
