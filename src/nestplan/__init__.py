"""nestplan: network- and memory-aware planning of distributed LLM training (NEST, MLSys 2026).

Library surface (see :mod:`nestplan.api`)::

    import nestplan
    model = nestplan.load_model("gpt3-175b")
    cluster = nestplan.load_cluster("dgx-a100", devices=64)
    job = nestplan.Job(global_batch_size=64, seq_len=2048)
    pred = nestplan.evaluate(model, cluster, nestplan.ParallelDims(tp=8, pp=8, recompute="full"), job)
"""

from nestplan.api import evaluate, evaluate_full, make_job
from nestplan.cluster import Cluster, load_cluster
from nestplan.errors import ConfigError, InfeasibleError, PlannerError
from nestplan.job import Job, Optimizer
from nestplan.model import ModelSpec, load_model
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.version import __version__

__all__ = [
    "Cluster",
    "ConfigError",
    "InfeasibleError",
    "Job",
    "ModelSpec",
    "Optimizer",
    "ParallelDims",
    "PlannerError",
    "Recompute",
    "Schedule",
    "ZeroStage",
    "__version__",
    "evaluate",
    "evaluate_full",
    "load_cluster",
    "load_model",
    "make_job",
]
