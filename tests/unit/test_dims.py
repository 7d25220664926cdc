"""ParallelDims validation: messages name both numbers."""

from __future__ import annotations

import pytest

from nestplan.errors import ConfigError
from nestplan.model import load_model
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.legality import check_against_model
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage


def test_derived_sizes() -> None:
    d = ParallelDims(tp=4, pp=2, dp=3, cp=2, ep=1)
    assert d.devices == 48 and d.stage_devices == 8
    assert d.num_microbatches(96) == 32
    assert d.zero is ZeroStage.NONE and d.recompute is Recompute.NONE


def test_strings_become_enums() -> None:
    d = ParallelDims(tp=2, sp=True, recompute="selective", zero=2, schedule="gpipe")
    assert d.recompute is Recompute.SELECTIVE and d.zero is ZeroStage.GRADIENTS and d.schedule is Schedule.GPIPE


@pytest.mark.parametrize("kwargs", [{"tp": 0}, {"pp": -1}, {"dp": 1.5}, {"micro_batch_size": 0}])
def test_non_positive_degrees(kwargs) -> None:
    with pytest.raises(ConfigError):
        ParallelDims(**kwargs)


def test_batch_not_divisible_names_both_numbers() -> None:
    with pytest.raises(ConfigError, match=r"global batch size 100 .* 3 x 1 x 2 = 6"):
        ParallelDims(dp=3, micro_batch_size=2).num_microbatches(100)


def test_tp_not_dividing_heads() -> None:
    with pytest.raises(ConfigError, match=r"tp 3 does not divide the model's 32 attention heads"):
        check_against_model(ParallelDims(tp=3), load_model("llama2-7b"), 4096)


def test_ep_on_dense_model() -> None:
    with pytest.raises(ConfigError, match="ep 2"):
        check_against_model(ParallelDims(ep=2), load_model("llama2-7b"), 4096)


def test_uneven_layers() -> None:
    d = ParallelDims(pp=3, layers_per_stage=(10, 11, 11))
    assert d.stage_layers(32) == (10, 11, 11)
    with pytest.raises(ConfigError, match="sums to 32 but the model has 30"):
        d.stage_layers(30)
    with pytest.raises(ConfigError, match="pp 3 does not divide the model's 32 layers"):
        ParallelDims(pp=3).stage_layers(32)


def test_sp_needs_tp() -> None:
    with pytest.raises(ConfigError, match="needs tp > 1"):
        ParallelDims(sp=True)


def test_interleaved_rules() -> None:
    with pytest.raises(ConfigError):
        ParallelDims(pp=2, virtual_stages=2)  # needs the interleaved schedule
    d = ParallelDims(pp=4, schedule="interleaved", virtual_stages=2)
    with pytest.raises(ConfigError, match="multiple of pp 4"):
        d.num_microbatches(6)
    with pytest.raises(ConfigError, match="does not split into 2 virtual stages"):
        ParallelDims(pp=2, schedule="interleaved", virtual_stages=2, layers_per_stage=(3, 5)).stage_layers(8)
