"""The DGX Cloud benchmarking recipes' settings that the shared runs file does not carry per row, read
from the recipes themselves (github.com/NVIDIA/dgxc-benchmarking, tag v24.11.1, commit 35a9aec) and NeMo
1.x's optimizer set-up (NVIDIA/NeMo v2.0.0, nemo/collections/nlp/models/language_modeling/
megatron_base_model.py ``setup_optimization``, the NeMo 24.09 container's):

- FP8 parameters in every FP8 run: llama3.1/configure.sh (``+model.fp8_params=$FP8_ENABLED``),
  nemotron/configure.sh (``+model.fp8_params=${FP8_ENABLED^}``), grok1/configure.sh
  (``model.fp8_params=${FP8_ENABLED^}``), nemo_megatron/gpt3_175b_hydra.yaml (``fp8_params: true``,
  which launch.sh leaves as it is);
- Grok-1's userbuffer tp overlap: grok1/configure.sh sets ``model.ub_tp_comm_overlap=true`` (its yaml's
  ``false`` is overridden; the runs file says false); its experts padded to capacity factor 1.0
  (grok1_314b.yaml ``moe_pad_expert_input_to_capacity: true``, ``moe_expert_capacity_factor: 1.0``);
- the optimizer's state: Llama 3.1, GPT-3 and Nemotron-4 run ``distributed_fused_adam`` (Apex) with
  ``megatron_amp_O2: true``, for which NeMo keeps only the fp32 master weights' low 16 bits beside the
  bf16 parameters (``store_param_remainders``) unless the parameters are FP8 (``store_params``: a whole
  master copy); Nemotron-4 340B's yaml sets the optimizer's ``dtype: bf16`` (nemotron4-340b-synth.yaml),
  so no master copy beside bf16 parameters, a bf16 one beside FP8 ones, and bf16 moments; Grok-1 runs
  ``mcore_distributed_optim`` (Megatron-core's distributed optimizer, fp32 state).

Run ``python tests/validation/dgxc_recipes.py RUNS.json OUT.json`` to write the rows as run, then
``nestplan validate OUT.json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# model_name prefix (proxies with fewer layers share it) -> the optimizer state of its BF16 runs
BF16_OPTIMIZER_STATE = {
    "Llama 3.1": "remainders",
    "GPT-3": "remainders",
    "Nemotron-4 15B": "remainders",
    "Nemotron-4 340B": "bf16",
    "Grok-1": "fp32",
}
# under fp8_params NeMo stores a whole master copy in the optimizer's dtype: fp32, bf16 for Nemotron-4 340B
FP8_OPTIMIZER_STATE = {
    "Llama 3.1": "fp32",
    "GPT-3": "fp32",
    "Nemotron-4 15B": "fp32",
    "Nemotron-4 340B": "bf16",
    "Grok-1": "fp32",
}


def _model(row: Mapping[str, Any]) -> str:
    name = str(row["model_name"])
    matches = [prefix for prefix in BF16_OPTIMIZER_STATE if name.startswith(prefix)]
    assert len(matches) == 1, f"no recipe settings for {name}"
    return matches[0]


def as_run(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row with the recipe's settings it lacks (the module docstring's sources)."""
    model, fp8 = _model(row), row["precision"] == "fp8"
    settings = {"fp8_params": fp8, "optimizer_state": (FP8_OPTIMIZER_STATE if fp8 else BF16_OPTIMIZER_STATE)[model]}
    if model == "Grok-1":
        settings.update(tp_comm_overlap=True, moe_capacity_factor=1.0)
    return {**row, **settings}


def rows_as_run(path: Path) -> dict[str, Any]:
    """The runs file with every row as run."""
    data = json.loads(path.read_text())
    return {**data, "rows": [as_run(row) for row in data["rows"]]}


if __name__ == "__main__":
    source, target = (Path(arg) for arg in sys.argv[1:3])
    target.write_text(json.dumps(rows_as_run(source), indent=1))
