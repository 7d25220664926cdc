"""Baseline planners over the same evaluator as nestplan (docs/design.md section 5): manual
(Megatron-style rules), phaze (the dynamic program blind to the network), mcmc (a random
walk) and alpa (a 2-D mesh with memory checked after choosing)."""

from nestplan.search.baselines.common import BaselineResult
from nestplan.search.baselines.alpa import alpa
from nestplan.search.baselines.manual import manual
from nestplan.search.baselines.mcmc import mcmc
from nestplan.search.baselines.phaze import phaze

BASELINES = {"manual": manual, "phaze": phaze, "mcmc": mcmc, "alpa": alpa}

__all__ = ["BASELINES", "BaselineResult", "alpa", "manual", "mcmc", "phaze"]
