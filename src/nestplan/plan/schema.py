"""The plan JSON's schema names and the bounds its reader holds every field to."""

SCHEMA = "nestplan.plan/2"
SCHEMA_V1 = "nestplan.plan/1"  # still read: no model config, no cluster definition
SCHEMAS = (SCHEMA, SCHEMA_V1)
# The job settings /1 plan files did not always carry, and what exports assumed for them before they did.
UNSAVED_JOB_SETTINGS = {"grad_dtype": "fp32", "optimizer": "adam", "flash_attention": True}
MAX_COUNT = 2**24  # the largest count a plan may give (devices, batch, tokens, degrees, layers): 16,777,216
MAX_STATISTIC = 2**53  # search statistics (splits costed, groups pruned)
MAX_TERMS = 64  # entries of a breakdown (step-time or memory terms)
CALIBRATION_RANGE = (1e-3, 1e3)  # a traced/closed-form ratio (nestplan plan --trace gives 0.9 to 1.1)
