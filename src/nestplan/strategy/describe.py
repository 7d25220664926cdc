"""A plan's degrees and settings as text: the one wording of predictions, reports, comparisons, sweeps and
export headers, in a short form (one line of words) and a long one (comma-separated, for tables and headers)."""

from __future__ import annotations

from collections.abc import Sequence

from nestplan.strategy.axes import Axis
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule


def describe(dims: ParallelDims, axis_order: Sequence[str] = (), *, long: bool = False) -> str:
    """``dims`` in one line, then the rank order (fastest first) when ``axis_order`` is given.

    Short: ``tp8+sp pp4 dp2 cp2 interleaved v2 mbs1 zero1 recompute full`` (no recomputation, no word).
    Long: ``tp 8+sp, pp 4, dp 2, cp 2, interleaved v 2, mbs 1, ZeRO 1, rc full, tp-cp-ep-pp-dp``.
    Both show cp and ep above 1, a schedule other than 1F1B with its virtual stages, and a folded MoE
    plan's expert degrees: ``etp1 (experts over 32)`` (expert tensor parallelism, expert parallelism)."""
    sep = " " if long else ""
    parts = [f"tp{sep}{dims.tp}{'+sp' if dims.sp_active else ''}", f"pp{sep}{dims.pp}", f"dp{sep}{dims.dp}"]
    parts += [f"{axis}{sep}{dims.degree(axis)}" for axis in (Axis.CP, Axis.EP) if dims.degree(axis) > 1]
    if dims.etp is not None:  # parallel folding: the experts' own degrees
        parts.append(f"etp{sep}{dims.etp} (experts over {dims.expert_parallel})")
    if dims.schedule is not Schedule.ONE_F_ONE_B:
        parts.append(dims.schedule.value + (f" v{sep}{dims.virtual_stages}" if dims.virtual_stages > 1 else ""))
    parts.append(f"mbs{sep}{dims.micro_batch_size}")
    if long:
        parts += [f"ZeRO {int(dims.zero)}", f"rc {dims.recompute.value}"]
    else:
        parts.append(f"zero{int(dims.zero)}")
        parts += [f"recompute {dims.recompute.value}"] if dims.recompute is not Recompute.NONE else []
    if axis_order:
        parts.append("-".join(axis_order))
    return (", " if long else " ").join(parts)
