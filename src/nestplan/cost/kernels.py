"""The kernels a framework runs, and what each costs relative to the accelerator's own figures.

An accelerator's ``attention_efficiency`` pair is its best fused attention kernel (cuDNN's, which
Transformer Engine runs; FlashAttention-3 on Hopper); without it attention runs at the GEMM efficiency
of its shapes. Other kernels are stated here as their speed relative to that, per accelerator
generation, from the kernels' own published comparisons. A framework picks a kernel per generation
(``FRAMEWORK_ATTENTION``) unless the job names one (``RunSettings.attention_kernel``), and runs its
elementwise kernels fused or eager (``EAGER_FRAMEWORKS``, cost/compute.py ``eager_extra_bytes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nestplan.errors import ConfigError
from nestplan.hardware.accelerator import Accelerator, Architecture
from nestplan.settings import AttentionKernel, Framework, RunSettings

# FlashAttention-2 against FlashAttention (1.x): "around 2x speedup" forward and backward (Dao 2023,
# FlashAttention-2, arXiv 2307.08691, abstract and section 4.1), on every generation either runs.
FLASH1_OVER_FLASH2 = 0.5
# FlashAttention-3 against FlashAttention-2 on H100 in BF16: forward "1.5-2.0x faster", backward
# "1.5-1.75x" (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, abstract and section 4.1); the
# middles of those ranges, as FlashAttention-2's share of the fused kernel's speed. Blackwell keeps
# Hopper's ratios (FlashAttention-2 uses neither generation's new tensor-core instructions).
FLASH2_HOPPER_FORWARD = 1 / 1.75
FLASH2_HOPPER_BACKWARD = 1 / 1.625
# On Ampere FlashAttention-2 is the fused kernel: "50-73% of the theoretical maximum FLOPs/s",
# "close to the efficiency of GEMM operations" (Dao 2023, abstract), as cuDNN's fused attention there.
_RELATIVE: Mapping[tuple[AttentionKernel, Architecture], tuple[float, float]] = {
    **{(AttentionKernel.CUDNN, arch): (1.0, 1.0) for arch in Architecture},
    (AttentionKernel.FLASH3, Architecture.HOPPER): (1.0, 1.0),
    **{
        (AttentionKernel.FLASH2, arch): (FLASH2_HOPPER_FORWARD, FLASH2_HOPPER_BACKWARD)
        for arch in (Architecture.HOPPER, Architecture.BLACKWELL)
    },
    **{(AttentionKernel.FLASH2, arch): (1.0, 1.0) for arch in (Architecture.AMPERE, Architecture.OTHER)},
}

# The kernel each framework runs: Transformer Engine's fused attention (cuDNN) under Megatron-Core;
# PyTorch's scaled_dot_product_attention, whose flash backend is FlashAttention-2 (PyTorch 2.2 release
# notes), under torchtitan and plain FSDP (Hugging Face's attn_implementation "sdpa"); Megatron-DeepSpeed's
# --use-flash-attn-v2.
FRAMEWORK_ATTENTION: Mapping[Framework, AttentionKernel] = {
    Framework.MEGATRON: AttentionKernel.CUDNN,
    Framework.NEMO: AttentionKernel.CUDNN,
    Framework.TORCHTITAN: AttentionKernel.FLASH2,
    Framework.DEEPSPEED: AttentionKernel.FLASH2,
    Framework.FSDP: AttentionKernel.FLASH2,
}
# Frameworks whose norms, activations and rotary embeddings run as PyTorch's eager kernels (no Transformer
# Engine or Apex fusions, torch.compile off by default): torchtitan (training.compile false) and plain FSDP.
# Megatron-DeepSpeed keeps Megatron's fused kernels (bias-GeLU, layer norm, softmax).
EAGER_FRAMEWORKS = frozenset({Framework.TORCHTITAN, Framework.FSDP})


def attention_kernel(settings: RunSettings) -> AttentionKernel:
    """The kernel the job runs: the one it names, else its framework's."""
    return settings.attention_kernel or FRAMEWORK_ATTENTION[settings.framework]


def relative_attention_speed(kernel: AttentionKernel, arch: Architecture) -> tuple[float, float]:
    """(forward, backward) speed of ``kernel`` relative to the accelerator's fused attention; a kernel
    that does not run on ``arch`` is refused in one line."""
    if kernel is AttentionKernel.FLASH1:
        forward, backward = relative_attention_speed(AttentionKernel.FLASH2, arch)
        return FLASH1_OVER_FLASH2 * forward, FLASH1_OVER_FLASH2 * backward
    found = _RELATIVE.get((kernel, arch))
    if found is None:
        runs_on = sorted({a.value for k, a in _RELATIVE if k is kernel})
        raise ConfigError(
            f"attention kernel {kernel.value} does not run on {arch.value} accelerators (it runs on "
            f"{', '.join(runs_on)})",
            field="attention_kernel",
            value=kernel.value,
            limit=runs_on,
        )
    return found


@dataclass(frozen=True)
class Kernels:
    """What the job's framework runs on its accelerator: its attention kernel's speed relative to the
    accelerator's fused one, and whether its elementwise kernels are eager."""

    attention_forward: float
    attention_backward: float
    eager: bool

    @classmethod
    def of(cls, settings: RunSettings, acc: Accelerator) -> Kernels:
        """The job's kernels on ``acc``, the attention kernel's speed times the accelerator's calibrated
        ``attention_factor`` (1 unless a profile set it: nestplan.profile). A framework whose own kernel does
        not run on the accelerator (FlashAttention on a V100) runs the accelerator's fused attention as its
        figures state it; a kernel the job names is refused there."""
        kernel = attention_kernel(settings)
        if settings.attention_kernel is None and (kernel, acc.architecture) not in _RELATIVE:
            kernel = AttentionKernel.CUDNN
        forward, backward = relative_attention_speed(kernel, acc.architecture)
        factor = acc.attention_factor
        return cls(forward * factor, backward * factor, settings.framework in EAGER_FRAMEWORKS)
