"""The ``published`` object of a runs-file row: what was measured (docs/formats.md, "Runs file").

The speed is given as seconds per step (``step_time_s``) or as tokens per second per GPU
(``tokens_per_s_per_gpu``, as llm-foundry and most training logs print it), converted to a step
time with the row's tokens per step: seq_len x global_batch / (tokens/s/GPU x gpus). The other
metric's figure may be given beside the value (the published files give both); it must then agree
with the value, so that a typo in either is refused instead of silently changing the row's error.
Measured memory per device, where a row gives it, is read with what it counts (``memory_metric``).
Every value is bounded so that every figure derived from it (tokens/s, the error) is finite.
"""

from __future__ import annotations

from dataclasses import dataclass

from nestplan.errors import brief
from nestplan.inputs import Fields
from nestplan import units

STEP_TIME_RANGE_S = (1e-6, 1e7)  # a measured step: a microsecond (no step is shorter) to ~116 days
MEMORY_RANGE_GiB = (1e-3, 2.0**20)  # a measured peak per device: 1 MiB to 1 PiB
DERIVED_AGREEMENT = 0.01  # a derived figure beside the value agrees with it within 1% (the files round)
METRICS = ("step_time_s", "tokens_per_s_per_gpu")
# what the memory figure counts, and so which prediction it is compared with (docs/formats.md):
# "allocated": torch.cuda.max_memory_allocated(), tensors only: the predicted peak less the accelerator's
# reserve (reserved_GiB: CUDA context, workspaces, fragmentation); "device": the device memory the process
# holds at its peak (nvidia-smi, NVML, or torch.cuda.max_memory_reserved() plus the CUDA context): the
# predicted peak with the reserve
MEMORY_METRICS = ("allocated", "device")
_READ_KEYS = ("metric", "value", "memory_GiB", "memory_metric")
# the source's own wording and figures, kept beside the measurement and not read
SOURCE_KEYS = (
    "conversion",
    "source",
    "table",
    "notes",
    "mfu_published",
    "hfu_published",
    "model_tflop_per_gpu_published",
    "num_params_published",
)
PUBLISHED_KEYS = (*_READ_KEYS, *METRICS, *SOURCE_KEYS)


@dataclass(frozen=True)
class Measured:
    """A run's measurement: its step time, and its peak memory per device with what it counts."""

    step_s: float
    memory_bytes: float | None = None
    memory_metric: str | None = None


def _figure(metric: str, step_s: float, tokens_per_step: int, gpus: int) -> float:
    """``metric``'s figure for a step of ``step_s`` seconds (tokens/s/GPU = tokens per step / step / gpus)."""
    return step_s if metric == METRICS[0] else tokens_per_step / step_s / gpus


def _positive(f: Fields, key: str) -> float:
    value = f.raw(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise f.error(
            f"field '{f.name(key)}' must be a positive number, got {brief(value)}", f.name(key), brief(value), "> 0"
        )
    return float(value)


def _step(f: Fields, metric: str, tokens_per_step: int, gpus: int) -> float:
    """The step time the value gives, within STEP_TIME_RANGE_S."""
    value = _positive(f, "value")
    step_s = value if metric == METRICS[0] else tokens_per_step / (value * gpus)
    low, high = STEP_TIME_RANGE_S
    if not low <= step_s <= high:
        given = "" if metric == METRICS[0] else f" (from {value:g} tokens/s/GPU)"
        raise f.error(
            f"the published step time {step_s:g} s{given} is outside [{low:g}, {high:g}] s",
            f.name("value"),
            value,
            f"[{low:g}, {high:g}] s",
            "s",
        )
    return step_s


def _check_derived(f: Fields, step_s: float, tokens_per_step: int, gpus: int) -> None:
    """Each metric's figure given beside the value agrees with the step time within DERIVED_AGREEMENT."""
    for metric in METRICS:
        if not f.has(metric):
            continue
        given = _positive(f, metric)
        expected = _figure(metric, step_s, tokens_per_step, gpus)
        if abs(given / expected - 1) > DERIVED_AGREEMENT:
            raise f.error(
                f"field '{f.name(metric)}' is {given:g} but the published value gives {expected:g} "
                f"(seq_len x global_batch / step time / gpus); they must agree within {DERIVED_AGREEMENT:.0%}",
                f.name(metric),
                given,
                expected,
            )


def _memory(f: Fields) -> tuple[float | None, str | None]:
    """The measured peak memory per device in bytes and what it counts, or (None, None) when not given."""
    if not f.has("memory_GiB") and not f.has("memory_metric"):
        return None, None
    f.require(("memory_GiB", "memory_metric"))
    gib = f.number("memory_GiB", *MEMORY_RANGE_GiB)
    return units.GiB_to_bytes(gib), f.choice("memory_metric", MEMORY_METRICS)


def read_published(row: Fields, tokens_per_step: int, gpus: int) -> Measured:
    """The row's ``published`` object as a Measured: every key known (any other refused by name), the
    metric one of METRICS, the derived figures consistent with the value, every value bounded."""
    f = row.table("published")
    f.refuse_unknown(PUBLISHED_KEYS)
    metric = f.choice("metric", METRICS)
    step_s = _step(f, metric, tokens_per_step, gpus)
    _check_derived(f, step_s, tokens_per_step, gpus)
    memory_bytes, memory_metric = _memory(f)
    return Measured(step_s, memory_bytes, memory_metric)
