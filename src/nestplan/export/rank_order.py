"""A node order that makes a framework's rank order land on the devices nestplan costed.

A framework numbers its ranks in its own axis order (Megatron-LM: tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp
with ``--use-tp-pp-dp-mapping``); a launcher numbers them node by node (global rank = node rank x
devices per node + local rank). Where the framework's order differs from the one nestplan costed,
the same groups still land where costed if each node of the allocation starts the framework's
ranks whose costed devices are that node's: a permutation of torchrun's node ranks. It exists when
every block of a node's worth of consecutive framework ranks was costed on one node, local rank
l on that node's device l (for instance replica-major costed, stage-major run, with tp x cp x ep a
multiple of the node's devices).

Rank 0 (every coordinate 0) is device 0 in any order, so node rank 0 stays on the allocation's
first node, where a launcher's master address points. ``node_ranks`` finds that permutation; ``node_rank_file`` writes it as a file a launch script reads
(one integer per line: no name from any input appears in it). Where no node order exists, a
launcher that places every rank itself (SLURM's ``--distribution=arbitrary`` with ``SLURM_HOSTFILE``)
follows ``rank_node_file``: the node each rank was costed on. Framework-neutral: each exporter
passes its framework's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from nestplan.export.common import comment_text
from nestplan.plan import Plan
from nestplan.strategy.placement import rank_grid

FILE_NAME = "node_ranks.txt"
RANK_FILE_NAME = "rank_nodes.txt"


def costed_device_of_rank(plan: Plan, framework_order: Sequence[str]) -> np.ndarray:
    """For each rank as the framework numbers it, the device nestplan costed that rank's work on
    (devices numbered node by node in network order, as the plan's placement lays ranks out)."""
    theirs = rank_grid(plan.dims, framework_order)
    ours = rank_grid(plan.dims, plan.axis_order)
    device = np.empty(plan.dims.devices, dtype=np.int64)
    device[theirs.ravel()] = ours.ravel()
    return device


def same_layout(plan: Plan, framework_order: Sequence[str]) -> bool:
    """Whether the framework's order puts every rank on the device nestplan costed it on (orders that
    differ only in axes of degree 1 do)."""
    return bool(np.array_equal(costed_device_of_rank(plan, framework_order), np.arange(plan.dims.devices)))


def node_ranks(plan: Plan, framework_order: Sequence[str], devices_per_node: int) -> tuple[int, ...] | None:
    """The node rank the launcher must give the allocation's k-th node (k in network order) so that
    the framework's rank groups are the ones nestplan costed; None where no node order does it (a
    node's worth of the framework's ranks costed across nodes, or in another order within a node)."""
    devices = plan.dims.devices
    if devices % devices_per_node:
        return None
    blocks = costed_device_of_rank(plan, framework_order).reshape(-1, devices_per_node)
    node = blocks[:, 0] // devices_per_node
    local = np.arange(devices_per_node)
    if not np.array_equal(blocks, node[:, None] * devices_per_node + local[None, :]):
        return None
    ranks = np.empty(len(node), dtype=np.int64)
    ranks[node] = np.arange(len(node))
    return tuple(int(r) for r in ranks)


def node_rank_file(plan: Plan, framework: str, framework_order: Sequence[str], devices_per_node: int) -> str | None:
    """The text of ``node_ranks.txt``: '#' comment lines, then line k (k from 0) holds the node rank
    of the allocation's k-th node; None where the orders agree (no file needed) or no node order exists."""
    order = tuple(framework_order)
    ranks = node_ranks(plan, order, devices_per_node)
    if ranks is None or same_layout(plan, order):
        return None
    explanation = (
        "line k (from 0, comments skipped) is the node rank the k-th node of the allocation (SLURM_NODEID k, "
        "nodes in network order) starts with, so that each rank runs on the device nestplan costed it on"
    )
    return _order_file(plan, order, f"node order for {framework}", explanation, ranks)


def rank_node_file(plan: Plan, framework: str, framework_order: Sequence[str], devices_per_node: int) -> str | None:
    """The text of ``rank_nodes.txt``: '#' comment lines, then line r (r from 0) holds the allocation's
    node (its index in network order) that the framework's rank r was costed on; None where the
    orders agree. Within a node the devices are alike to nestplan's placement (a node is its first level)."""
    order = tuple(framework_order)
    if same_layout(plan, order):
        return None
    nodes = costed_device_of_rank(plan, order) // devices_per_node
    explanation = (
        "line r (from 0, comments skipped) is the node of the allocation (its index in network order) that rank r "
        "runs on: SLURM_HOSTFILE lines for srun --distribution=arbitrary"
    )
    return _order_file(plan, order, f"rank placement for {framework}", explanation, nodes)


def _order_file(plan: Plan, order: tuple[str, ...], title: str, explanation: str, rows: Iterable[int]) -> str:
    """Two '#' comment lines (``title`` with the framework's and nestplan's axis orders, then
    ``explanation``), then one integer of ``rows`` a line."""
    head = (
        f"{title}, which numbers ranks {'-'.join(order)} (fastest first); nestplan costed {'-'.join(plan.axis_order)}",
        explanation,
    )
    return "".join(f"# {comment_text(line)}\n" for line in head) + "".join(f"{int(r)}\n" for r in rows)
