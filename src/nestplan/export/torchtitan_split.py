"""torchtitan 0.3.0's pipeline split: the layers per (virtual) stage its split flags give, the flags that
give the costed split, and where none do, the split its config module lists module by module
(``nestplan.export.torchtitan``'s pipeline flags and config module read it)."""

from __future__ import annotations

from nestplan.plan import Plan


def titan_split(num_layers: int, stages: int, first_less: int, last_less: int) -> list[int] | None:
    """Transformer layers per (virtual) stage as torchtitan 0.3.0 splits them
    (``generate_llm_fqn_per_model_part``): num_layers + first_less + last_less effective layers
    spread evenly, the remainder one each to the first stages, the first stage giving up
    ``first_less`` and the last ``last_less`` layers to the embedding and the head. None where
    torchtitan refuses the numbers."""
    effective = num_layers + first_less + last_less
    per, extra = divmod(effective, stages)
    if stages > effective or per == 0 or first_less > per or last_less > per:
        return None
    counts = [per + (1 if k < extra else 0) for k in range(stages)]
    counts[0] -= first_less
    counts[-1] -= last_less
    return counts


def stage_weights(target: list[int]) -> tuple[int, int] | None:
    """The (first_less, last_less) for which torchtitan's split equals ``target``, if any."""
    for first in range(max(target) + 1):
        for last in range(max(target) + 1):
            if titan_split(sum(target), len(target), first, last) == target:
                return first, last
    return None


def layers_per_stage_flag(target: list[int], weights: tuple[int, int]) -> int | None:
    """torchtitan's --parallelism.pipeline-parallel-layers-per-stage that makes ``len(target)`` stages
    (it makes ceil(effective layers / layers-per-stage)), or None where none does."""
    lps = max(target)
    return lps if -(-(sum(target) + sum(weights)) // lps) == len(target) else None


def listed_split(plan: Plan) -> list[int] | None:
    """The layers per (virtual) stage where torchtitan's split flags cannot give the costed split, which
    the config module then lists module by module (``module_fqns_per_model_part``); None where the
    flags give it."""
    d = plan.dims
    if d.pp == 1:
        return None
    target = list(d.virtual_stage_layers(plan.model.num_layers))  # virtual stage i runs on rank i % pp
    weights = stage_weights(target)
    if weights is None or (
        d.virtual_stages > 1 and layers_per_stage_flag(target, weights) is None and d.virtual_stages != 2
    ):
        return target
