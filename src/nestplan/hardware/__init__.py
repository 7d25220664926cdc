"""Accelerators: peak FLOP/s per dtype, HBM capacity and bandwidth, efficiency model."""

from nestplan.hardware.accelerator import Accelerator, accelerator_names, load_accelerator

__all__ = ["Accelerator", "accelerator_names", "load_accelerator"]
