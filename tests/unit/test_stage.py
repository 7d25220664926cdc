"""The shared stage module (cost/stage.py) and the in-flight rule (cost/memory.py) it charges.

Memory: every schedule's peak of live microbatches per stage, counted on the simulation's own
timeline, is what ``in_flight_microbatches`` charges. Search and evaluator: the search's
per-position tables (memory besides the blocks plus the blocks', cycle besides the blocks plus
the blocks') give the evaluator's stage memory and cycle for the same 1F1B split.
"""

from __future__ import annotations

import numpy as np
import pytest

from nestplan import api
from nestplan.cost import stage
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.memory import in_flight_microbatches, live_activation_peak
from nestplan.cost.schedules import warmup_forwards
from nestplan.cost.schedules.periodic import FORWARD, simulate
from nestplan.job import Job
from nestplan.search.physical import Group, PhysicalSearchModel
from nestplan.strategy.subgraph import SubGraph
from nestplan.strategy.axes import REPLICA_MAJOR
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage

SCHEDULES = [(Schedule.ONE_F_ONE_B, 1), (Schedule.GPIPE, 1), (Schedule.INTERLEAVED, 2), (Schedule.INTERLEAVED, 3)]


def _peak_live_chunks(
    p: int, m: int, schedule: Schedule, v: int, chunk_bytes: np.ndarray | None = None, per_chunk_times: bool = False
) -> list[float]:
    """Per stage, the most model chunks (or, given ``chunk_bytes`` (p, v), the most bytes of them)
    whose forward ran and whose backward has not, in the simulation's timeline order."""
    rng = np.random.default_rng(p * 100 + m)
    shape = (p, v) if per_chunk_times else p
    fwd, bwd = rng.uniform(1.0, 2.0, shape), rng.uniform(2.0, 4.0, shape)
    _, timeline = simulate(fwd, bwd, m, schedule, v, record=True)
    weights = np.ones((p, v)) if chunk_bytes is None else chunk_bytes
    peaks = []
    for s in range(p):
        on = timeline.stage == s
        order = np.argsort(timeline.start_s[on], kind="stable")
        held = weights[s, timeline.chunk[on][order]]
        steps = np.where(timeline.kind[on][order] == FORWARD, held, -held)
        peaks.append(float(np.cumsum(steps).max()))
    return peaks


@pytest.mark.parametrize("schedule,v", SCHEDULES)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("factor", [1, 2, 3])
def test_memory_charges_the_simulations_live_microbatches(schedule, v, p, factor) -> None:
    if schedule is Schedule.INTERLEAVED and p == 1:
        pytest.skip("the interleaved schedule needs pp > 1")
    m = p * factor if schedule is Schedule.INTERLEAVED else p + factor
    peaks = _peak_live_chunks(p, m, schedule, v)
    charged = [in_flight_microbatches(schedule, s, p, m, v) * v for s in range(p)]
    assert peaks == pytest.approx(charged), (schedule, v, p, m)


@pytest.mark.parametrize("v", [2, 3, 5])
@pytest.mark.parametrize("p", [2, 3, 4, 6])
@pytest.mark.parametrize("factor", [1, 2, 3])
def test_memory_charges_the_simulations_live_chunks_of_unequal_size(v, p, factor) -> None:
    """Uneven interleaved layouts: chunks of a stage store different bytes per microbatch (their
    blocks, the embedding, the head; a chunk holding only the embedding stores little), and run for
    different times; the peak is the largest sum of the live chunks' bytes."""
    m = p * factor
    rng = np.random.default_rng(p * v + factor)
    chunk_bytes = rng.uniform(0.0, 5.0, (p, v)) * (rng.random((p, v)) < 0.8)
    peaks = _peak_live_chunks(p, m, Schedule.INTERLEAVED, v, chunk_bytes, per_chunk_times=True)
    charged = [live_activation_peak(Schedule.INTERLEAVED, s, p, m, chunk_bytes[s]) for s in range(p)]
    assert peaks == pytest.approx(charged, rel=1e-12), (v, p, m)
    even = [live_activation_peak(Schedule.INTERLEAVED, s, p, m, np.full(v, 1.5)) for s in range(p)]
    assert even == pytest.approx(
        [in_flight_microbatches(Schedule.INTERLEAVED, s, p, m, v) * 1.5 * v for s in range(p)], rel=1e-12
    )


def test_warmups_are_the_in_flight_rules_count() -> None:
    """Interleaved with m == pp runs every forward first (Megatron-LM), else 2 (p - s - 1) + (v - 1) p."""
    assert warmup_forwards(Schedule.INTERLEAVED, np.arange(4), 4, 4, 2).tolist() == [8] * 4
    assert warmup_forwards(Schedule.INTERLEAVED, np.arange(4), 4, 8, 2).tolist() == [10, 8, 6, 4]
    assert warmup_forwards(Schedule.ONE_F_ONE_B, np.arange(4), 4, 2, 1).tolist() == [2, 2, 1, 0]
    assert warmup_forwards(Schedule.GPIPE, np.arange(3), 3, 5, 1).tolist() == [5, 5, 5]


@pytest.mark.parametrize(
    "name,zero,recompute",
    [
        ("llama2-7b", ZeroStage.NONE, Recompute.NONE),
        ("llama2-7b", ZeroStage.OPTIMIZER, Recompute.SELECTIVE),
        ("gpt3-175b", ZeroStage.OPTIMIZER, Recompute.FULL),
        ("mixtral-8x7b", ZeroStage.NONE, Recompute.NONE),
    ],
)
def test_search_tables_give_the_evaluators_stages(name, zero, recompute) -> None:
    model = api.resolve_model(name)
    cluster = api.resolve_cluster("h100-spine-leaf", 64)
    job = Job(global_batch_size=64, seq_len=2048)
    ep = 8 if model.is_moe else 1
    sub = SubGraph(tp=2, sp=True, cp=1, ep=ep, micro_batch_size=1, recompute=recompute)
    pp, replicas = 4, 64 // (2 * ep * 4)
    group = Group(sub, REPLICA_MAJOR, zero, replicas, job.global_batch_size // (replicas * ep), pp)
    cost = PhysicalSearchModel(model, cluster, job, 64)
    tables = cost.tables(group)
    parts = tuple(model.num_layers // pp + (1 if s < model.num_layers % pp else 0) for s in range(pp))
    pred = evaluate_plan(model, cluster, group.dims(pp, parts), job, REPLICA_MAJOR)
    blocks = stage.block_arrays(cost._stage_context(group), cost.terms(group), cost._kinds)
    inflight = in_flight_microbatches(Schedule.ONE_F_ONE_B, np.arange(pp), pp, group.microbatches, 1)
    for s, (n, st) in enumerate(zip(parts, pred.stages)):
        held = tables.mem_fixed[pp - 1, s] + n * (blocks.states[0] + blocks.activations[0] * inflight[s])
        assert held == pytest.approx(st.peak_memory_bytes, rel=1e-12)
        assert tables.alpha[pp - 1, s] + n * tables.beta == pytest.approx(st.cycle_s, rel=1e-12)


def test_stage_sums_hold_the_embedding_head_and_tied_copy() -> None:
    model = api.resolve_model("gpt3-175b")  # tied embeddings: the last of several stages keeps a copy
    cluster = api.resolve_cluster("h100-spine-leaf", 64)
    job = Job(global_batch_size=64, seq_len=2048)
    sub = SubGraph(tp=8, sp=True, cp=1, ep=1, micro_batch_size=1, recompute=Recompute.NONE)
    cost = PhysicalSearchModel(model, cluster, job, 64)
    t = cost.terms(Group(sub, REPLICA_MAJOR, ZeroStage.NONE, 1, 64, 8))
    dense = model.block_kind(0)
    kinds = [dense] * 3
    first, middle, last = (stage.stage_sums(t, kinds, s, 3) for s in range(3))
    block = 3 * t.blocks[dense].params.dense
    assert middle.params.dense == pytest.approx(block)
    assert first.params.dense == pytest.approx(block + t.embedding.params.dense)
    assert last.params.dense == pytest.approx(block + t.head.params.dense + t.embedding_copy.dense)
    assert t.embedding_copy.dense > 0
    alone = stage.stage_sums(t, [dense] * model.num_layers, 0, 1)
    assert alone.params.dense == pytest.approx(
        model.num_layers * t.blocks[dense].params.dense + t.embedding.params.dense + t.head.params.dense
    )


@pytest.mark.parametrize("schedule,v", SCHEDULES)
@pytest.mark.parametrize(
    "name,devices,tp,pp", [("llama2-7b", 32, 2, 4), ("mixtral-8x7b", 64, 1, 4), ("gpt3-175b", 64, 8, 8)]
)
def test_step_floor_never_exceeds_the_step(schedule, v, name, devices, tp, pp) -> None:
    """The planner skips splits and schedules by step_floor_s: it must bound every one from below."""
    from dataclasses import replace

    from nestplan.cost.evaluator import step_floor_s
    from nestplan.strategy.dims import ParallelDims

    model = api.resolve_model(name)
    if model.num_layers % v:
        pytest.skip(f"{model.num_layers} layers do not split into chunks of {v}")
    cluster = api.resolve_cluster("h100-spine-leaf", devices)
    job = Job(global_batch_size=8 * devices, seq_len=2048)
    ep = 8 if model.is_moe else 1
    dp = devices // (tp * pp * ep)
    rng = np.random.default_rng(len(name) * pp)
    for _ in range(6):
        cuts = np.sort(rng.choice(np.arange(1, model.num_layers // v), pp - 1, replace=False))
        parts = tuple(int(x) * v for x in np.diff(np.concatenate([[0], cuts, [model.num_layers // v]])))
        dims = ParallelDims(tp=tp, pp=pp, dp=dp, ep=ep, sp=tp > 1, zero=1, layers_per_stage=parts)
        dims = replace(dims, schedule=schedule, virtual_stages=v)
        step = evaluate_plan(model, cluster, dims, job).step_time_s
        assert step_floor_s(model, cluster, dims, job) <= step, (parts, schedule, v)


@pytest.mark.parametrize(
    "name,devices,tp,pp,v",
    [("llama2-7b", 32, 2, 4, 2), ("mixtral-8x7b", 64, 1, 4, 3), ("gpt3-175b", 64, 8, 8, 2), ("gpt3-175b", 64, 8, 7, 7)],
)
def test_step_floor_never_exceeds_the_step_of_uneven_layouts(name, devices, tp, pp, v) -> None:
    """Layers per virtual stage (random, the first and last virtual stage sometimes holding only the
    embedding or the head; and the end-balanced layout the planner tries): the floor still bounds."""
    from nestplan.cost.evaluator import step_floor_s
    from nestplan.cost.schedules.families import ends_balanced_layout
    from nestplan.strategy.dims import ParallelDims

    model = api.resolve_model(name)
    cluster = api.resolve_cluster("h100-spine-leaf", devices)
    job = Job(global_batch_size=8 * devices - 8 * devices % (pp * 8), seq_len=2048)
    ep = 8 if model.is_moe else 1
    dp = devices // (tp * pp * ep)
    rng = np.random.default_rng(pp * v)
    layouts = [ends_balanced_layout(model.num_layers, pp, v)]
    for _ in range(5):
        cuts = np.sort(rng.choice(np.arange(1, model.num_layers), pp * v - 1, replace=False))
        counts = np.diff(np.concatenate([[0], cuts, [model.num_layers]]))
        for end, inner in ((0, 1), (-1, -2)):
            if rng.random() < 0.4:
                counts[inner] += counts[end]
                counts[end] = 0
        layouts.append(tuple(int(x) for x in counts))
    for layout in (x for x in layouts if x is not None):
        dims = ParallelDims(
            tp=tp,
            pp=pp,
            dp=dp,
            ep=ep,
            sp=tp > 1,
            zero=1,
            schedule=Schedule.INTERLEAVED,
            virtual_stages=v,
            layers_per_stage=layout,
        )
        step = evaluate_plan(model, cluster, dims, job).step_time_s
        assert step_floor_s(model, cluster, dims, job) <= step, (layout, v)


@pytest.mark.parametrize(("name", "zero"), [("deepseek-v2-lite", ZeroStage.OPTIMIZER), ("gemma2-9b", ZeroStage.NONE)])
def test_least_stage_bytes_never_exceeds_the_fullest_stage(name, zero) -> None:
    """The search's floor (stage.least_stage_bytes, which refuses a group before its depths are split) is
    below the evaluator's fullest stage for every split it covers: random splits over 1 .. 8 stages."""
    model = api.resolve_model(name)
    cluster = api.resolve_cluster("h100-spine-leaf", 64)
    job = Job(global_batch_size=64, seq_len=4096)
    ep = 8 if model.is_moe else 1
    sub = SubGraph(tp=1, sp=False, cp=1, ep=ep, micro_batch_size=1, recompute=Recompute.NONE)
    rng = np.random.default_rng(7)
    for pp in (1, 2, 4, 8):
        replicas = 64 // (ep * pp)
        group = Group(sub, REPLICA_MAJOR, zero, replicas, job.global_batch_size // (replicas * ep), pp)
        cost = PhysicalSearchModel(model, cluster, job, 64)
        terms, ctx = cost.memory_terms(group), cost._stage_context(group)
        inflight = stage.first_stage_in_flight(min(group.microbatches, model.num_layers), model.num_layers)
        floor = stage.least_stage_bytes(ctx, terms, cost._kinds, pp, float(inflight[:pp].min()))
        for _ in range(5):
            cuts = np.sort(rng.choice(np.arange(1, model.num_layers), pp - 1, replace=False))
            parts = tuple(int(n) for n in np.diff(np.concatenate([[0], cuts, [model.num_layers]])))
            pred = evaluate_plan(model, cluster, group.dims(pp, parts), job, REPLICA_MAJOR)
            assert floor <= max(s.peak_memory_bytes for s in pred.stages) * (1 + 1e-12)
