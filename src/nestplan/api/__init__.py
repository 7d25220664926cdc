"""The library surface: load inputs, evaluate a plan. The CLI is a thin shell over this.

What the library offers, by module (every name below is importable as ``nestplan.api.<name>``):

- inputs (``resolve``): ``resolve_model``, ``resolve_cluster``, ``framework_settings``, ``job_for``,
  ``make_job``, ``default_dtype``, ``search_space``, ``check_exportable``, ``megatron_dp``,
  ``DEFAULT_GLOBAL_BATCH``;
- the catalog (``listings``): ``catalog_names``, ``catalog_entries``, ``CATALOG_KINDS``;
- one given plan (``evaluation``): ``evaluate``, ``evaluate_full`` and its ``Evaluation``, ``plot_plan``,
  ``framework_order`` (the rank order ``evaluate`` takes by default), ``reevaluate`` (a saved plan with changes);
- the search (``planning``): ``plan``, its ``PlanReport`` and ``ScheduleAlternative``, ``MAX_TOP``;
- a whole run (``run``): ``run_length``, ``with_facility``, ``plan_range`` and its ``RangeReport``,
  ``Limits``;
- baseline planners (``comparison``): ``CompareCase``, ``Comparison``, ``compare``, ``paper_cases``;
- the tools (``tools``): ``sweep``, ``sweep_report``, ``MAX_WORKERS``, ``load_plan``, ``validate``,
  ``validation_misses``, ``export_plan``, ``trace``, ``calibrate``, ``nest_solve``, ``nest_explain``.

The CLI calls each as ``api.<name>`` at call time, so that a test replacing one here reaches it.
"""

from nestplan.api.comparison import CompareCase, Comparison, compare, paper_cases
from nestplan.api.display import NAME_WIDTH
from nestplan.api.evaluation import Evaluation, evaluate, evaluate_full, framework_order, plot_plan, reevaluate
from nestplan.api.listings import CATALOG_KINDS, catalog_entries, catalog_names
from nestplan.api.planning import MAX_TOP, PlanReport, ScheduleAlternative, plan
from nestplan.api.run import RangeReport, plan_range, run_length, with_facility
from nestplan.api.resolve import (
    DEFAULT_GLOBAL_BATCH,
    check_exportable,
    default_dtype,
    export_framework,
    framework_settings,
    job_for,
    megatron_dp,
    resolve_cluster,
    resolve_model,
    search_space,
)
from nestplan.api.tools import (
    MAX_WORKERS,
    calibrate,
    calibrate_runs,
    cross_validate,
    export_plan,
    load_plan,
    nest_explain,
    nest_solve,
    sweep,
    sweep_report,
    trace,
    validate,
    validation_misses,
)
from nestplan.job import make_job
from nestplan.profile import calibrated_cluster
from nestplan.search.sizes import Limits

__all__ = [
    "CATALOG_KINDS",
    "DEFAULT_GLOBAL_BATCH",
    "MAX_TOP",
    "MAX_WORKERS",
    "NAME_WIDTH",
    "CompareCase",
    "Comparison",
    "Evaluation",
    "Limits",
    "PlanReport",
    "RangeReport",
    "ScheduleAlternative",
    "calibrate",
    "calibrate_runs",
    "calibrated_cluster",
    "cross_validate",
    "catalog_entries",
    "catalog_names",
    "check_exportable",
    "compare",
    "default_dtype",
    "evaluate",
    "evaluate_full",
    "framework_order",
    "reevaluate",
    "export_framework",
    "export_plan",
    "framework_settings",
    "job_for",
    "load_plan",
    "make_job",
    "megatron_dp",
    "nest_explain",
    "nest_solve",
    "paper_cases",
    "plan",
    "plan_range",
    "plot_plan",
    "resolve_cluster",
    "resolve_model",
    "run_length",
    "search_space",
    "sweep",
    "sweep_report",
    "trace",
    "validate",
    "validation_misses",
    "with_facility",
]
