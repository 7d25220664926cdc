"""The schedules that split the backward into B and W (zb-h1, zbv, dualpipev): their operation
orders, the simulation's closed forms, the memory rule against the simulated timeline, the
evaluator and the planner."""

from __future__ import annotations

import numpy as np
import pytest

from nestplan import api
from nestplan.cost.memory import in_flight_microbatches
from nestplan.cost.schedules import stage_operations
from nestplan.cost.schedules.operations import FORWARD, FULL_BACKWARD, INPUT_GRAD, OVERLAPPED, WEIGHT_GRAD
from nestplan.cost.schedules.periodic import simulate
from nestplan.cost.schedules.walk import SplitTimes, activation_peak, simulate_operations
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.strategy.dims import ParallelDims, virtual_stage_index
from nestplan.strategy.enums import Schedule

SPLIT = (Schedule.ZB_H1, Schedule.ZBV, Schedule.DUALPIPEV)


def _times(p: int, v: int, f: float, b: float, w: float, comm: float = 0.0) -> SplitTimes:
    full = np.full((p, v), 1.0)
    return SplitTimes(f * full, b * full, w * full, comm * full, comm * full)


def _makespan(schedule: Schedule, p: int, m: int, f: float, b: float, w: float) -> float:
    v = 2 if schedule.v_shaped else 1
    return simulate_operations(schedule, _times(p, v, f, b, w), m).makespan_s


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 13), (8, 32), (8, 64)])
@pytest.mark.parametrize("f,b,w", [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (0.7, 1.6, 0.5)])
def test_zb_h1_reproduces_its_closed_form(p, m, f, b, w) -> None:
    """Qi et al. ICLR 2024, section 2.1 / Table 2: ZB-H1's bubble is (p - 1)(F + B - 2W) with B the
    whole backward (B + W in the split's terms), 1F1B's (p - 1)(F + B) (for m >= p)."""
    whole = b + w
    assert _makespan(Schedule.ZB_H1, p, m, f, b, w) == pytest.approx(m * (f + whole) + (p - 1) * (f + whole - 2 * w))
    one_f_one_b, _ = simulate([f] * p, [whole] * p, m)
    assert one_f_one_b == pytest.approx(m * (f + whole) + (p - 1) * (f + whole))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_dualpipev_bubble_is_deepseeks(p) -> None:
    """DeepSeek-V3 technical report (arXiv 2412.19437) Table 2: DualPipe's bubble is
    (PP/2 - 1)(F&B + B - 3W) with B the full backward and F&B an overlapped pair, for chunks of
    equal time; DualPipeV, DualPipe cut in half, runs its 2 pp virtual stages on pp devices
    (PP/2 = pp). Without communication F&B = F + B."""
    chunk = 0.5
    m = 3 * p
    busy = m * 2 * 3 * chunk
    f, whole, w = chunk, 2 * chunk, chunk
    assert _makespan(Schedule.DUALPIPEV, p, m, chunk, chunk, chunk) - busy == pytest.approx(
        (p - 1) * ((f + whole) + whole - 3 * w)
    )


def test_dualpipev_overlap_hides_communication_under_compute() -> None:
    """An F&BW costs the longer of its compute and its communication, so communication up to the
    compute is free there and the step is shorter than with the same times unoverlapped."""
    p, m = 4, 16
    quiet = simulate_operations(Schedule.DUALPIPEV, _times(p, 2, 1.0, 1.0, 1.0), m).makespan_s
    talking = simulate_operations(Schedule.DUALPIPEV, _times(p, 2, 1.4, 1.4, 1.0, comm=0.4), m).makespan_s
    zbv = simulate_operations(Schedule.ZBV, _times(p, 2, 1.4, 1.4, 1.0, comm=0.4), m).makespan_s
    assert talking < zbv
    assert quiet < talking < quiet * 1.4


def test_memory_of_each_schedule() -> None:
    """In units of one stage's activations per microbatch (two chunks of half each under a V):
    1F1B holds p - s; ZB-H1 at most 1F1B's stage 0 (section 2.1: "no greater than 1F1B"); ZB-V
    p on every stage (Qi et al. 2024, arXiv 2405.15362: 1F1B's peak); DualPipeV PP + 1 chunks
    (DeepSeek-V3 Table 2, PP = 2 pp virtual stages)."""
    p, m = 8, 32
    one = [in_flight_microbatches(Schedule.ONE_F_ONE_B, s, p, m, 1) for s in range(p)]
    assert one == [p - s for s in range(p)]
    zb = [activation_peak(Schedule.ZB_H1, s, p, m, [1.0], [0.4]) for s in range(p)]
    assert zb[0] == p and max(zb) == p and all(zb[s] >= one[s] for s in range(p))
    assert [activation_peak(Schedule.ZBV, s, p, m, [0.5, 0.5], [0.2, 0.2]) for s in range(p)] == [p] * p
    assert [activation_peak(Schedule.DUALPIPEV, s, p, m, [0.5, 0.5], [0.2, 0.2]) for s in range(p)] == [
        (2 * p + 1) * 0.5
    ] * p


def _timeline_peak(run, stage: int, chunk_bytes, kept) -> float:
    """The most bytes a stage holds in the simulated run, from its operations' start and end times:
    a forward stores at its start, a B frees all but the kept bytes at its end, a W the kept ones."""
    events = []
    for op, start, end in zip(run.ops[stage], run.start_s[stage], run.end_s[stage]):
        if op.kind in (FORWARD, OVERLAPPED):
            events.append((start, 1, chunk_bytes[op.chunk]))
        if op.kind == INPUT_GRAD:
            events.append((end, 0, -(chunk_bytes[op.chunk] - kept[op.chunk])))
        elif op.kind == WEIGHT_GRAD:
            events.append((end, 0, -kept[op.chunk]))
        elif op.kind == FULL_BACKWARD:
            events.append((end, 0, -chunk_bytes[op.chunk]))
        elif op.kind == OVERLAPPED:
            events.append((end, 0, -chunk_bytes[op.chunk2]))
    live = peak = 0.0
    for _, _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("schedule", SPLIT)
def test_simulated_memory_equals_the_in_flight_rule_stage_by_stage(schedule) -> None:
    p, m = 4, 12
    v = 2 if schedule.v_shaped else 1
    rng = np.random.default_rng(7)
    times = SplitTimes(*(rng.uniform(0.5, 1.5, (p, v)) for _ in range(3)), np.zeros((p, v)), np.zeros((p, v)))
    run = simulate_operations(schedule, times, m)
    chunk_bytes, kept = [3.0, 2.0][:v], [1.0, 0.5][:v]
    for s in range(p):
        assert _timeline_peak(run, s, chunk_bytes, kept) == pytest.approx(
            activation_peak(schedule, s, p, m, chunk_bytes, kept)
        )


@pytest.mark.parametrize("schedule", SPLIT)
def test_every_operation_runs_once_after_its_inputs(schedule) -> None:
    p, m = 4, 9
    v = 2 if schedule.v_shaped else 1
    run = simulate_operations(schedule, _times(p, v, 1.0, 1.0, 0.5), m)
    seen = {}
    for s in range(p):
        for op, start, end in zip(run.ops[s], run.start_s[s], run.end_s[s]):
            passes = [("F", op.chunk, op.microbatch)] if op.kind in (FORWARD, OVERLAPPED) else []
            if op.kind in (INPUT_GRAD, FULL_BACKWARD):
                passes.append(("B", op.chunk, op.microbatch))
            if op.kind in (WEIGHT_GRAD, FULL_BACKWARD):
                passes.append(("W", op.chunk, op.microbatch))
            if op.kind == OVERLAPPED:
                passes += [("B", op.chunk2, op.microbatch2), ("W", op.chunk2, op.microbatch2)]
            for kind, chunk, j in passes:
                key = (kind, virtual_stage_index(schedule, s, chunk, p), j)
                assert key not in seen
                seen[key] = (start, end)
    chunks = p * v
    assert len(seen) == 3 * chunks * m
    for (kind, i, j), (start, _) in seen.items():
        if kind == "F" and i > 0:
            assert start >= seen[("F", i - 1, j)][1] - 1e-12
        if kind == "B":
            assert start >= (seen[("B", i + 1, j)][1] if i < chunks - 1 else seen[("F", i, j)][1]) - 1e-12
        if kind == "W":
            assert start >= seen[("B", i, j)][1] - 1e-12 or seen[("B", i, j)] == seen[("W", i, j)]


def _torch_actions(schedule_class, p: int, m: int, rank: int, local_stages: int):
    """torch.distributed.pipelining's own order for one rank, computed without a process group
    (the stand-in: the schedule object is built without its stages, with the fields the order reads)."""
    obj = schedule_class.__new__(schedule_class)
    obj.pp_group_size, obj._n_microbatches, obj.n_local_stages, obj.rank = p, m, local_stages, rank
    obj.num_stages = obj._num_stages = p * local_stages
    obj.number_of_rounds = max(1, m // p)
    obj.microbatches_per_round = m // obj.number_of_rounds
    return [a for a in obj._calculate_single_rank_operations(rank) if a is not None]


@pytest.mark.parametrize("name", ["ZB_H1", "ZBV", "DUALPIPEV"])
def test_orders_equal_torch_pipelining(name) -> None:
    """The orders stated from the papers equal torch.distributed.pipelining's (torch 2.13:
    ScheduleInterleavedZeroBubble with one stage per rank, ScheduleZBVZeroBubble, ScheduleDualPipeV),
    which torchtitan runs."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules", reason="needs torch (the trace extra)")
    schedule = Schedule[name]
    cls = {
        "ZB_H1": schedules.ScheduleInterleavedZeroBubble,
        "ZBV": schedules.ScheduleZBVZeroBubble,
        "DUALPIPEV": schedules.ScheduleDualPipeV,
    }[name]
    local = 2 if schedule.v_shaped else 1
    names = {
        "FORWARD": FORWARD,
        "BACKWARD_INPUT": INPUT_GRAD,
        "BACKWARD_WEIGHT": WEIGHT_GRAD,
        "FULL_BACKWARD": FULL_BACKWARD,
    }
    for p in (2, 3, 4, 8):
        for m in (2 * p, 2 * p + 1, 3 * p, 16):
            for s in range(p):
                ours = []
                for op in stage_operations(schedule, s, p, m, local):
                    vs = virtual_stage_index(schedule, s, op.chunk, p)
                    if op.kind == OVERLAPPED:
                        ours.append(
                            (
                                OVERLAPPED,
                                vs,
                                op.microbatch,
                                virtual_stage_index(schedule, s, op.chunk2, p),
                                op.microbatch2,
                            )
                        )
                    else:
                        ours.append((op.kind, vs, op.microbatch))
                theirs = []
                for a in _torch_actions(cls, p, m, s, local):
                    if a.sub_actions:
                        f, b = a.sub_actions
                        theirs.append(
                            (OVERLAPPED, f.stage_index, f.microbatch_index, b.stage_index, b.microbatch_index)
                        )
                    else:
                        theirs.append((names[a.computation_type.name], a.stage_index, a.microbatch_index))
                assert ours == theirs, (name, p, m, s)


def test_v_schedules_place_virtual_stages_in_a_v() -> None:
    dims = ParallelDims(pp=4, schedule=Schedule.ZBV, virtual_stages=2, layers_per_stage=(6, 8, 8, 10))
    assert [dims.virtual_stage_position(i) for i in range(8)] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (3, 0),
        (3, 1),
        (2, 1),
        (1, 1),
        (0, 1),
    ]
    assert dims.virtual_stage_layers(32) == (3, 4, 4, 5, 5, 4, 4, 3)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"schedule": Schedule.ZBV, "virtual_stages": 3}, "virtual_stages"),
        ({"schedule": Schedule.DUALPIPEV, "virtual_stages": 2, "pp": 1}, "schedule"),
        ({"schedule": Schedule.ZB_H1, "virtual_stages": 2}, "virtual_stages"),
        ({"schedule": Schedule.ZBV, "virtual_stages": 2, "layers_per_stage": (2,) * 8}, "layers_per_stage"),
    ],
)
def test_illegal_split_schedules_are_refused(kwargs, field) -> None:
    base = {"pp": 4}
    base.update(kwargs)
    with pytest.raises(ConfigError) as err:
        ParallelDims(**base)
    assert err.value.field == field


def test_v_schedules_need_two_pp_microbatches() -> None:
    dims = ParallelDims(pp=4, dp=2, schedule=Schedule.DUALPIPEV, virtual_stages=2)
    assert dims.batch_conflict(64) is None  # 32 microbatches
    problem = dims.batch_conflict(14)  # 7 < 8
    assert problem is not None and "at least 2 x pp = 8 microbatches" in str(problem)


def _evaluate(schedule: Schedule, v: int = 1):
    dims = ParallelDims(tp=4, sp=True, pp=8, dp=2, schedule=schedule, virtual_stages=v)
    return api.evaluate_full(
        "llama3-70b", "dgx-h100", dims, Job(global_batch_size=128, seq_len=8192), devices=64
    ).prediction


def test_evaluator_costs_each_schedule() -> None:
    """Same degrees: the zero-bubble schedules shrink the bubble; ZB-H1 keeps stage 0's memory of
    1F1B and holds more on later stages (the deferred W inputs); DualPipeV hides communication."""
    one = _evaluate(Schedule.ONE_F_ONE_B)
    zb = _evaluate(Schedule.ZB_H1)
    zbv = _evaluate(Schedule.ZBV, 2)
    dual = _evaluate(Schedule.DUALPIPEV, 2)
    assert zb.breakdown_s["pipeline_bubble"] < one.breakdown_s["pipeline_bubble"] / 1.5
    assert zbv.breakdown_s["pipeline_bubble"] < zb.breakdown_s["pipeline_bubble"]
    assert zb.stages[0].memory_bytes["activations"] == pytest.approx(one.stages[0].memory_bytes["activations"])
    assert zb.stages[-1].memory_bytes["activations"] > one.stages[-1].memory_bytes["activations"]
    assert dual.breakdown_s["tp_comm"] == pytest.approx(zbv.breakdown_s["tp_comm"])  # stays in line
    for pred in (zb, zbv, dual):
        assert sum(pred.breakdown_s.values()) == pytest.approx(pred.step_time_s)
        assert pred.step_time_s < one.step_time_s
    assert zbv.stages[0].has_embedding and zbv.stages[0].has_head and not zbv.stages[-1].has_head
    assert zbv.stages[0].memory_bytes["weights"] > one.stages[0].memory_bytes["weights"]  # the head's too


def test_planner_considers_the_split_schedules() -> None:
    report = api.plan("llama3-70b", "dgx-h100", Job(global_batch_size=128, seq_len=8192), devices=64, top=8)
    schedules = {p.plan.schedule for p in (report.best, *report.runners_up)}
    assert schedules & set(SPLIT), schedules


def test_dualpipev_hides_the_expert_all_to_alls() -> None:
    """DeepSeek-V3 section 3.2.1: the overlapped F&BW runs one microbatch's expert all-to-alls under
    the other's compute; the breakdown's ep_comm shrinks by what hid, its compute does not."""
    job = Job(global_batch_size=256, seq_len=4096)

    def run(schedule: Schedule):
        dims = ParallelDims(ep=8, pp=2, dp=4, schedule=schedule, virtual_stages=2)
        return api.evaluate_full("mixtral-8x7b", "dgx-h100", dims, job, devices=64).prediction

    zbv, dual = run(Schedule.ZBV), run(Schedule.DUALPIPEV)
    assert 0 < dual.breakdown_s["ep_comm"] < zbv.breakdown_s["ep_comm"]
    assert dual.breakdown_s["forward_compute"] == pytest.approx(zbv.breakdown_s["forward_compute"])
    assert sum(dual.breakdown_s.values()) == pytest.approx(dual.step_time_s)


PLAN_ARGS = [
    "plan",
    "--model",
    "llama3-70b",
    "--cluster",
    "dgx-h100",
    "--devices",
    "64",
    "--global-batch-size",
    "128",
    "--top",
    "0",
]


def test_search_space_keeps_what_the_export_framework_runs() -> None:
    m = api.resolve_model("llama3-70b")
    assert set(api.search_space().schedules) == set(Schedule)
    assert api.search_space(export="megatron", model=m).schedules == (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
    assert api.search_space(export="deepspeed", model=m).schedules == (Schedule.ONE_F_ONE_B,)
    assert api.search_space(schedules=(Schedule.ZBV,), export="torchtitan", model=m).schedules == (
        Schedule.ONE_F_ONE_B,
        Schedule.ZBV,
    )
    assert api.search_space(schedules=(Schedule.ZBV,), export="megatron", model=m).schedules == (Schedule.ONE_F_ONE_B,)


def test_cli_schedules_option(capsys) -> None:
    from cli_helpers import run_cli

    code, out, _ = run_cli(capsys, PLAN_ARGS + ["--schedules", "1f1b,interleaved"])
    assert code == 0
    assert "schedule zb-h1" not in out and "schedule zbv" not in out and "schedule dualpipev" not in out
    code, _, err = run_cli(capsys, PLAN_ARGS + ["--schedules", "zbv,zb-h2"])
    assert code == 2 and "--schedules names 'zb-h2'" in err and err.count("\n") == 1


def test_plan_shows_every_schedule_at_its_degrees(capsys) -> None:
    """Why each other schedule lost at the chosen degrees: slower (with its bubble), not fitting, or
    not legal there (with the reason)."""
    report = api.plan("llama3-70b", "dgx-h100", Job(global_batch_size=128, seq_len=8192), devices=64, top=0)
    alternatives = {a.schedule: a for a in report.schedule_alternatives()}
    assert set(alternatives) == set(Schedule)
    picked = alternatives[report.best.plan.schedule]
    assert picked.prediction is report.best and picked.verdict(report.best) == "the plan's"
    gpipe = alternatives[Schedule.GPIPE]
    assert gpipe.prediction is not None and "does not fit" in gpipe.verdict(report.best)
    for alt in alternatives.values():
        if alt.prediction is not None and alt.prediction.fits and alt is not picked:
            assert alt.prediction.step_time_s >= report.best.step_time_s * (1 - 1e-12)
            assert alt.verdict(report.best).startswith("+")
    from cli_helpers import run_cli

    code, out, _ = run_cli(capsys, PLAN_ARGS)
    assert code == 0 and "pipeline schedules at these degrees" in out and "the plan's" in out
