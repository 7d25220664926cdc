"""The best-first search's two shortcuts against what they replace (hypothesis, small random instances).

A group's lower bound (search/physical.py ``lower_bound``, tightened to the depths that fit)
never exceeds the proxy of any split the enumeration finds for it, and the first, looser bound
(every depth; ZeRO 2 and 3 on ZeRO 0's terms) never exceeds the tightened one; the memory-only check
(``fits``, and ``feasible_depths`` depth by depth) says what the engine's ``run_group`` says; and the best-first run returns the sequential run's candidates, in the same
order, ties included (the two rank-grid orders often tie exactly at one replica).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_dp_exact import EVERY_ZERO_SPACE, instances

from nestplan.job import Job
from nestplan.search.engine import Candidate, Engine, run, run_best_first
from nestplan.search.oracle import enumerate_group
from nestplan.search.physical import PhysicalSearchModel
from nestplan.search.planner import _groups
from nestplan.search.space import replica_counts
from nestplan.strategy.subgraph import SubGraph
from nestplan.strategy.enums import Recompute, ZeroStage


def _bound_below_every_split(inst) -> None:
    model, cluster, job = inst
    cost = PhysicalSearchModel(model, cluster, job, cluster.devices)
    for _, _, group, _ in _groups(model, cluster, job, cluster.devices, EVERY_ZERO_SPACE):
        bound = cost.lower_bound(group)
        assert cost.lower_bound(group, fitted=False) <= bound, group
        for e in enumerate_group(cost, group, cluster.accelerator.hbm_bytes):
            assert bound <= e.pipeline_s + cost.extras(group, e.parts), (group, e.parts)


def _fit_check_agrees(inst) -> None:
    model, cluster, job = inst
    cost = PhysicalSearchModel(model, cluster, job, cluster.devices)
    engine = Engine(cost, cluster.accelerator.hbm_bytes)
    for _, key, group, _ in _groups(model, cluster, job, cluster.devices, EVERY_ZERO_SPACE):
        assert cost.fits(group) == engine.run_group(group, key), group


def _feasible_depths_agree(inst) -> None:
    """Per depth, the memory-only check says what the engine's split says (a finite pipeline time)."""
    model, cluster, job = inst
    cost = PhysicalSearchModel(model, cluster, job, cluster.devices)
    engine = Engine(cost, cluster.accelerator.hbm_bytes)
    for _, _, group, _ in _groups(model, cluster, job, cluster.devices, EVERY_ZERO_SPACE):
        depths = cost.feasible_depths(group)
        if depths is None:
            continue
        tab = cost.tables(group)
        solved = np.isfinite(engine._pipeline_times(group, tab, engine._splits(group, tab)[0]))
        assert depths.tolist() == solved.tolist(), group


# a few instances in the default run (each enumerates every split of every group); many more under `slow`
QUICK = settings(max_examples=6, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
THOROUGH = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@QUICK
@given(instances())
def test_bound_never_exceeds_any_split_of_its_group(inst) -> None:
    _bound_below_every_split(inst)


@QUICK
@given(instances())
def test_feasible_depths_are_the_engines(inst) -> None:
    _feasible_depths_agree(inst)


@pytest.mark.slow
@THOROUGH
@given(instances())
def test_feasible_depths_are_the_engines_thoroughly(inst) -> None:
    _feasible_depths_agree(inst)


@pytest.mark.slow
@THOROUGH
@given(instances())
def test_bound_never_exceeds_any_split_of_its_group_thoroughly(inst) -> None:
    _bound_below_every_split(inst)


@QUICK
@given(instances())
def test_memory_only_check_says_what_run_group_says(inst) -> None:
    _fit_check_agrees(inst)


@pytest.mark.slow
@THOROUGH
@given(instances())
def test_memory_only_check_says_what_run_group_says_thoroughly(inst) -> None:
    _fit_check_agrees(inst)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from([1, 2, 4, 32]), st.sampled_from([2, 3]), st.booleans())
def test_best_first_returns_the_sequential_candidates(inst, keep, escalate_from, every_zero) -> None:
    model, cluster, job = inst
    space = EVERY_ZERO_SPACE if every_zero else replace(EVERY_ZERO_SPACE, zero=(ZeroStage.NONE, ZeroStage.GRADIENTS))
    found = []
    for runner in (run, run_best_first):
        engine = Engine(PhysicalSearchModel(model, cluster, job, cluster.devices), cluster.accelerator.hbm_bytes, keep)
        groups = _groups(model, cluster, job, cluster.devices, space)
        found.append([(c.proxy_s, c.key, c.parts) for c in runner(engine, groups, escalate_from=escalate_from)])
    assert found[0] == found[1]


def test_equal_proxies_keep_the_earlier_group_whatever_the_visiting_order() -> None:
    """Best-first visits groups out of their sequential order: on equal proxies the candidate of
    the earlier group (the earlier rank within a group) must stay, as in the sequential run."""
    engine = Engine(model=None, capacity_bytes=0.0, keep=2)
    for proxy, order, rank in ((1.0, 5, 0), (1.0, 3, 1), (1.0, 3, 0), (0.5, 9, 0), (1.0, 4, 0)):
        engine._push(Candidate(proxy, (order, rank), None, ()), order, rank)
    assert [c.key for c in engine.best()] == [(9, 0), (3, 0)]
    assert engine.dominated(1.0, 3, 1) and engine.dominated(1.0, 4) and not engine.dominated(1.0, 2, 7)
    assert not engine.dominated(0.99, 100)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([1, 2, 3, 4, 8, 16]),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 5000),
    st.sampled_from([1, 2, 8]),
    st.integers(1, 20000),
)
def test_replica_counts_are_every_d_whose_shards_divide_the_batch(ep, mbs, gbs, tp, devices) -> None:
    sub = SubGraph(tp=tp, ep=ep, micro_batch_size=mbs, recompute=Recompute.NONE)
    job = Job(global_batch_size=gbs, seq_len=128)
    expected = [d for d in range(1, devices // (tp * ep) + 1) if gbs % (d * ep * mbs) == 0]
    assert replica_counts(sub, job, devices) == expected


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_memory_terms_hold_what_the_groups_own_terms_hold(inst) -> None:
    """The fit check reads params, activations and transients from terms shared by every replica
    count of a configuration and ZeRO stage: they equal the group's own."""
    model, cluster, job = inst
    cost = PhysicalSearchModel(model, cluster, job, cluster.devices)
    for _, _, group, _ in _groups(model, cluster, job, cluster.devices, EVERY_ZERO_SPACE):
        own, shared = cost.terms(group), cost.memory_terms(group)
        for a, b in [(own.blocks[k], shared.blocks[k]) for k in own.blocks] + [
            (own.embedding, shared.embedding),
            (own.head, shared.head),
        ]:
            assert (a.params, a.activations, a.transient) == (b.params, b.activations, b.transient)
        assert own.embedding_copy == shared.embedding_copy
