"""nestplan: network- and memory-aware planning of distributed LLM training (NEST, MLSys 2026).

Library surface (see :mod:`nestplan.api`)::

    import nestplan
    model = nestplan.load_model("gpt3-175b")
    cluster = nestplan.load_cluster("dgx-a100", devices=64)
    job = nestplan.Job(global_batch_size=64, seq_len=2048)
    pred = nestplan.evaluate(model, cluster, nestplan.ParallelDims(tp=8, pp=8, recompute="full"), job)
    report = nestplan.plan("llama2-7b", "dgx-a100", devices=64)    # the search: nestplan.api.plan

``nestplan.plan`` is the module of the typed plan (``nestplan.plan.Plan``, ``from nestplan.plan
import Plan``) and, called, the search :func:`nestplan.api.plan`, which returns a ``PlanReport``.
Results show as one line in a terminal and as tables in a notebook, ``to_dict()`` gives their plain
JSON values, and they pickle (docs/notebooks.md).
"""

import copyreg
import inspect
import sys
from types import MappingProxyType, ModuleType

from nestplan import api, plan
from nestplan.api import Evaluation, PlanReport, evaluate, evaluate_full, make_job
from nestplan.cluster import Cluster, load_cluster
from nestplan.cost.prediction import Prediction
from nestplan.errors import ConfigError, InfeasibleError, PlannerError
from nestplan.job import Job, Optimizer
from nestplan.model import ModelSpec, load_model
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.version import __version__


class _PlanModule(ModuleType):
    """The module ``nestplan.plan``, callable as the search: ``nestplan.plan(model, cluster, ...)`` is
    ``nestplan.api.plan(model, cluster, ...)``, like ``nestplan.evaluate`` beside it."""

    __call__ = staticmethod(api.plan)
    __signature__ = inspect.signature(api.plan)  # help() and a notebook's completion show the search's


sys.modules["nestplan.plan"].__class__ = _PlanModule


def _read_only(mapping: dict) -> MappingProxyType:
    return MappingProxyType(mapping)


# The results' read-only tables (breakdowns, memory terms, group spans, peak FLOP/s) pickle as the
# plain dicts they view and are read-only again once loaded: results travel to worker processes
# and are saved from notebooks.
copyreg.pickle(MappingProxyType, lambda proxy: (_read_only, (dict(proxy),)))

__all__ = [
    "Cluster",
    "ConfigError",
    "Evaluation",
    "InfeasibleError",
    "Job",
    "ModelSpec",
    "Optimizer",
    "ParallelDims",
    "Plan",
    "PlanReport",
    "PlannerError",
    "Prediction",
    "Recompute",
    "Schedule",
    "ZeroStage",
    "__version__",
    "evaluate",
    "evaluate_full",
    "load_cluster",
    "load_model",
    "make_job",
    "plan",
]
