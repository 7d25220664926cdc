"""SubGraph: the sub-graph strategy of a plan (NEST section 3.1), one validated value object.

What splits every layer over the devices of one stage (tp with optional sp, cp, ep and etp), with the
microbatch and the recomputation that fix what a layer stores: the part of a plan that the search's
groups, the per-layer formulas' ``Shard`` and ``ParallelDims`` share. The graph-global choices (pp, dp,
ZeRO, schedule, stage split) live in ``strategy.dims.ParallelDims``.
"""

from __future__ import annotations

from dataclasses import dataclass

from nestplan.errors import ConfigError
from nestplan.strategy.enums import Recompute


def config_error(message: str, field: str, value: object, limit: object = None) -> ConfigError:
    """A bad plan value: the error ``ParallelDims`` and ``SubGraph`` raise."""
    return ConfigError(message, field=field, value=value, limit=limit)


def require_positive(name: str, value: object) -> None:
    """Raise unless ``value`` (the plan field ``name``) is a positive integer (a bool is none)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise config_error(f"{name} must be a positive integer, got {value!r}", name, value, ">= 1")


@dataclass(frozen=True)
class SubGraph:
    """The sub-graph strategy: how one stage's ``tp x cp x ep`` devices split every layer, and the
    microbatch and recomputation each layer runs with.

    Parallel folding (Megatron-Core's MoE layers on their own grid, Liu et al. 2025, "MoE Parallel
    Folding", arXiv 2504.14960): the experts are split ``etp`` ways (expert tensor parallelism) and
    spread over ``expert_parallel = ep x tp / etp`` ranks, the ep ranks of the data-parallel part
    together with tp / etp ranks of each tensor-parallel group (etp consecutive tp ranks share an
    expert's shard). ``etp`` None is etp = tp: the experts split like the attention, their expert
    parallelism the ep ranks alone (Megatron-LM's default when --expert-tensor-parallel-size is unset).
    Either way a device holds 1 / (tp x ep) of the expert weights, replicated over cp x dp.
    """

    tp: int = 1
    sp: bool = False
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    micro_batch_size: int = 1
    recompute: Recompute = Recompute.NONE

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "ep", "micro_batch_size"):
            require_positive(name, getattr(self, name))
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        if self.sp and self.tp == 1:
            raise config_error("sequence parallelism (sp) needs tp > 1, got tp 1", "sp", self.sp, "tp > 1")
        self._check_expert_tp()

    def _check_expert_tp(self) -> None:
        etp = self.etp
        if etp is None:
            return
        if not isinstance(etp, int) or isinstance(etp, bool) or etp < 1:
            raise config_error(f"etp must be a positive integer, got {etp!r}", "etp", etp, ">= 1")
        if self.tp % etp:
            raise config_error(
                f"expert tensor parallelism etp {etp} must divide tp {self.tp} (etp consecutive ranks of each "
                "tensor-parallel group share an expert's shard)",
                "etp",
                etp,
                self.tp,
            )
        if etp == self.tp:
            object.__setattr__(self, "etp", None)  # the default, stored one way
        elif not self.sp:
            raise config_error(
                f"expert tensor parallelism etp {etp} below tp {self.tp} needs sequence parallelism (the MoE "
                "layer takes each rank's own tokens; Megatron-Core requires sp for MoE with tp > 1)",
                "sp",
                self.sp,
                True,
            )

    # -- derived sizes ---------------------------------------------------------
    @property
    def stage_devices(self) -> int:
        """Devices of one stage of one replica: tp * cp * ep."""
        return self.tp * self.cp * self.ep

    @property
    def expert_tp(self) -> int:
        """Ranks that split one expert's FFN (expert tensor parallelism): etp, tp unless folded."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_parallel(self) -> int:
        """Ranks that hold different experts: ep x tp / etp, the ep ranks with the tp / etp ranks of each
        tensor-parallel group that fold into expert parallelism (ep unless folded)."""
        return self.ep * self.tp // self.expert_tp

    @property
    def sp_active(self) -> bool:
        """Sequence parallelism splits the activations over tp."""
        return self.sp and self.tp > 1
