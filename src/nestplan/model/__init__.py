"""The model being trained: its architecture (ModelSpec) read from a config.json; ``from_module``
measures a PyTorch model's per-block FLOPs and saved activations (extra [trace], imported lazily)."""

from nestplan.model.config import load_model, model_names, parse_config
from nestplan.model.families import SUPPORTED_FAMILIES
from nestplan.model.spec import ModelSpec

__all__ = ["ModelSpec", "SUPPORTED_FAMILIES", "from_module", "load_model", "model_names", "parse_config"]


def from_module(module, sample_inputs, blocks=None):
    """See nestplan.model.trace.from_module (needs torch; imported on first use)."""
    from nestplan.model.trace import from_module as trace_module

    return trace_module(module, sample_inputs, blocks)
