"""Names that moved to ``nestplan.strategy.placement``, re-exported for the modules that still import
them from here (search/infeasible.py, search/baselines/common.py, search/baselines/mcmc.py and two
tests); delete this module once they import from strategy.placement or search.space."""

from nestplan.strategy.placement import NAMED_ORDERS as SEARCH_ORDERS
from nestplan.strategy.placement import REPLICA_MAJOR, STAGE_MAJOR

__all__ = ["REPLICA_MAJOR", "SEARCH_ORDERS", "STAGE_MAJOR"]
