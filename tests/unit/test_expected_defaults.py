"""Defaults people expect (issue 30): the V-shaped schedules' two chunks, a2a+p2p's all-to-all group."""

from __future__ import annotations

import pytest
from cli_helpers import run_cli

from nestplan.model.config import load_model
from nestplan.strategy.legality import widest_a2a_group

EVALUATE = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch-size", "16"]


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_shaped_schedules_run_their_two_chunks_without_being_told(capsys, schedule) -> None:
    argv = [*EVALUATE, "--devices", "8", "--pp", "2", "--dp", "4", "--seq-len", "1024", "--schedule", schedule]
    code, out, err = run_cli(capsys, argv)
    assert code == 0, err
    assert f"schedule {schedule} (v=2)" in out
    code, _, err = run_cli(capsys, [*argv, "--virtual-stages", "3"])
    assert code == 2 and "runs 2 chunks per stage" in err


def test_a2a_p2p_takes_the_widest_all_to_all_inside_an_nvlink_domain(capsys) -> None:
    argv = [*EVALUATE, "--devices", "16", "--tp", "2", "--cp", "8", "--seq-len", "16384", "--cp-comm-type", "a2a+p2p"]
    code, out, err = run_cli(capsys, argv)
    assert code == 0, err
    assert "cp 8 (a2a+p2p 4 x 2)" in out  # tp 2 x 4 = the 8 GPUs of a DGX H100's NVLink domain
    code, out, err = run_cli(capsys, [*argv, "--cp-a2a-size", "2"])
    assert code == 0 and "cp 8 (a2a+p2p 2 x 4)" in out, err


def test_the_widest_group_divides_cp_and_the_heads_and_leaves_a_ring() -> None:
    llama = load_model("llama3-8b")  # 32 query, 8 key/value heads
    assert widest_a2a_group(llama, cp=8, tp=1, domain_devices=8) == 4  # a ring of 2 across
    assert widest_a2a_group(llama, cp=16, tp=1, domain_devices=8) == 8
    assert widest_a2a_group(llama, cp=16, tp=4, domain_devices=8) == 2  # tp 4 x 2 fills the domain
    assert widest_a2a_group(llama, cp=2, tp=1, domain_devices=8) is None  # no ring left
