"""The model being trained: its architecture (ModelSpec) read from a config.json."""

from nestplan.model.config import load_model, model_names, parse_config
from nestplan.model.spec import SUPPORTED_FAMILIES, ModelSpec

__all__ = ["ModelSpec", "SUPPORTED_FAMILIES", "load_model", "model_names", "parse_config"]
