"""The new families' costs where they differ from a GPT block: tensor-parallel syncs of hybrid, parallel
and latent-attention blocks, context parallelism of Mamba-2 mixers, the Mamba divisibility rules,
selective recomputation's FLOPs, MLA's replicated parameters, elementwise traffic, and the exports'
refusal of hybrid stacks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.cost import comm
from nestplan.cost.compute import _elementwise_bytes
from nestplan.cost.evaluator import _model_flops
from nestplan.errors import ConfigError
from nestplan.model import layers as L
from nestplan.model.layers import Shard
from nestplan.network import collectives as coll
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.legality import model_conflict, tp_conflict
from nestplan.strategy.enums import Recompute
from nestplan.strategy.placement import GroupSpan

CLUSTER = api.resolve_cluster("dgx-h100", 64)
TOPO = CLUSTER.topology
LEVELS = TOPO.num_levels
NEMOTRON_H = api.resolve_model("nemotron-h-8b")  # M, -, *: one sub-block per layer
NANO = api.resolve_model("nemotron-3-nano-30b-a3b")  # M, E, *
JAMBA = api.resolve_model("jamba-1.5-mini")  # Mamba-1 or attention, then MLP or MoE
FALCON = api.resolve_model("falcon-40b")  # parallel attention and MLP
DEEPSEEK = api.resolve_model("deepseek-v3")  # MLA with a query latent
LLAMA = api.resolve_model("llama3-8b")


def _group(size: int) -> GroupSpan:
    return GroupSpan(size=size, fanout=(size,) + (1,) * (LEVELS - 1), level=0)


def _groups(tp: int = 1, cp: int = 1) -> dict[str, GroupSpan]:
    return {"tp": _group(tp), "cp": _group(cp), "expert": _group(1), "etp": _group(tp)}


def _first(spec, mixer: str, ffn: bool, moe: bool = False) -> int:
    return next(
        i
        for i in range(spec.num_layers)
        if spec.mixer_of(i) == mixer and spec.has_ffn(i) == ffn and spec.is_moe_layer(i) == moe
    )


def _comm(spec, layer: int, shard: Shard, tp: int, cp: int = 1, overlap: bool = False, gemm_s: float = 0.0):
    gemms = [(gemm_s, 2 * gemm_s)] * len(L.block_gemms(spec, layer, shard))
    return comm.block_comm(TOPO, spec, layer, shard, _groups(tp, cp), 0.0, gemms, tp_overlap=overlap)


def _one_sync(spec, shard: Shard, tp: int) -> float:
    return comm.tp_collectives(TOPO, _group(tp), shard, spec.hidden_size, 1)


# ---------------------------------------------------------------- tensor-parallel syncs
@pytest.mark.parametrize("mixer, ffn", [("mamba", False), ("none", True), ("attention", False)])
def test_a_nemotron_h_layer_syncs_its_one_sub_block_once(mixer: str, ffn: bool) -> None:
    """Nemotron-H's M, - and * layers hold one sub-block each: one tp sync per direction, not two."""
    shard = Shard(tp=4, seq_len=4096)
    layer = _first(NEMOTRON_H, mixer, ffn)
    got = _comm(NEMOTRON_H, layer, shard, 4)
    assert got.tp_forward == pytest.approx(_one_sync(NEMOTRON_H, shard, 4))
    assert got.tp_backward == pytest.approx(got.tp_forward)


def test_an_moe_only_layer_pays_no_attention_sync() -> None:
    """Nemotron-3-Nano's E layer has no mixer: its tp traffic is its MoE MLP's alone (routed copies
    and the shared expert), one sync fewer than an attention + MoE block of the same model would pay."""
    shard = Shard(tp=4, sp=True, seq_len=4096)
    layer = _first(NANO, "none", True, moe=True)
    one = _one_sync(NANO, shard, 4)
    expected = (NANO.experts_per_token + NANO.num_shared_experts) * one
    assert _comm(NANO, layer, shard, 4).tp_forward == pytest.approx(expected)


@pytest.mark.parametrize("spec", [NEMOTRON_H, NANO, JAMBA])
def test_tp_comm_overlap_takes_each_sub_blocks_own_gemms(spec) -> None:
    """With overlap every kind of hybrid layer is costed (no IndexError on a one-sub-block layer), and
    under GEMMs of no time each sync is exposed whole: the same as without overlap; under long GEMMs
    less, except in an MoE-only layer (grouped expert GEMMs overlap nothing)."""
    shard = Shard(tp=2, sp=True, seq_len=4096)
    for i in {spec.block_kind(i): i for i in range(spec.num_layers)}.values():
        plain = _comm(spec, i, shard, 2)
        hidden = _comm(spec, i, shard, 2, overlap=True)
        assert hidden.tp_forward == pytest.approx(plain.tp_forward)
        long = _comm(spec, i, shard, 2, overlap=True, gemm_s=1.0)
        moe_only = spec.mixer_of(i) == "none" and spec.is_moe_layer(i)
        assert long.tp_forward == pytest.approx(plain.tp_forward) if moe_only else long.tp_forward < plain.tp_forward


def test_nemotron_h_evaluates_with_tp_comm_overlap() -> None:
    """The plan the defect report names: it crashed with IndexError on gemms[2]."""
    dims = ParallelDims(tp=2, sp=True, dp=32)
    job = api.job_for(NEMOTRON_H, CLUSTER, 512, 8192, tp_comm_overlap=True)
    pred = api.evaluate(NEMOTRON_H, CLUSTER, dims, job)
    assert pred.step_time_s > 0


def test_jamba_pays_its_x_proj_all_reduce() -> None:
    """A Mamba-1 mixer's x_proj is row-parallel (vLLM MambaMixer): dt, B, C (R + 2 N per token) are
    all-reduced over tp each way, besides the mixer's and the MLP's syncs."""
    shard = Shard(tp=4, seq_len=4096)
    layer = _first(JAMBA, "mamba", True)
    x_proj = coll.all_reduce(TOPO, (4,) + (1,) * (LEVELS - 1), 2 * shard.tokens * (256 + 2 * 16))
    got = _comm(JAMBA, layer, shard, 4)
    assert got.tp_forward == pytest.approx(2 * _one_sync(JAMBA, shard, 4) + x_proj)
    assert got.tp_backward == pytest.approx(got.tp_forward)
    attention = _comm(JAMBA, _first(JAMBA, "attention", True), shard, 4)
    assert attention.tp_forward == pytest.approx(2 * _one_sync(JAMBA, shard, 4))


@pytest.mark.parametrize("sp", [False, True])
def test_falcons_parallel_block_syncs_once(sp: bool) -> None:
    """Falcon's attention and MLP read one input and sum their outputs (HF modeling_falcon): one
    gather and one reduce per direction, half of the sequential block's."""
    shard = Shard(tp=8, sp=sp, seq_len=2048)
    parallel = _comm(FALCON, 0, shard, 8)
    sequential = _comm(replace(FALCON, parallel_block=False), 0, shard, 8)
    assert parallel.tp_forward == pytest.approx(_one_sync(FALCON, shard, 8))
    assert parallel.tp_forward == pytest.approx(sequential.tp_forward / 2)
    overlapped = _comm(FALCON, 0, replace(shard, sp=True), 8, overlap=True, gemm_s=1.0)
    assert overlapped.tp_forward < _one_sync(FALCON, replace(shard, sp=True), 8)


def test_mla_gathers_its_latents_under_sequence_parallelism() -> None:
    """Megatron-core's MLA runs its down-projections on each rank's own tokens and gathers the query
    latent, the key/value latent and the rotary key: 1536 + 512 + 64 channels per token for
    DeepSeek-V3, not its hidden 7168; the reduce-scatter after o_proj still moves the hidden states."""
    tp, shard = 8, Shard(tp=8, sp=True, seq_len=4096)
    fanout = (tp,) + (1,) * (LEVELS - 1)
    gather = coll.all_gather(TOPO, fanout, 2 * shard.tokens * (1536 + 512 + 64))
    scatter = coll.reduce_scatter(TOPO, fanout, 2 * shard.tokens * DEEPSEEK.hidden_size)
    dense = _first(DEEPSEEK, "attention", True)
    got = _comm(DEEPSEEK, dense, shard, tp).tp_forward
    assert got == pytest.approx(gather + scatter + _one_sync(DEEPSEEK, shard, tp))
    no_sp = _comm(DEEPSEEK, dense, replace(shard, sp=False), tp).tp_forward
    assert no_sp == pytest.approx(2 * _one_sync(DEEPSEEK, replace(shard, sp=False), tp))


# ---------------------------------------------------------------- context parallelism
def test_context_exchange_only_where_the_mixer_needs_it() -> None:
    """cp 2: attention exchanges keys and values, a Mamba-2 mixer pays Megatron-core's all-to-alls
    (in_proj output before the scan, y after it), MLP-only and MoE-only layers nothing."""
    shard = Shard(tp=2, cp=2, seq_len=8192)
    mlp = _comm(NEMOTRON_H, _first(NEMOTRON_H, "none", True), shard, 2, cp=2)
    moe = _comm(NANO, _first(NANO, "none", True, moe=True), shard, 2, cp=2)
    assert (mlp.cp_forward, mlp.cp_backward, moe.cp_forward, moe.cp_backward) == (0.0, 0.0, 0.0, 0.0)
    m = NEMOTRON_H.mamba
    t = 2
    widths = [
        m.inner / t,
        m.inner / t,
        m.groups / t * m.state_size,
        m.groups / t * m.state_size,
        m.num_heads / t,
        m.inner / t,
    ]
    fanout = (2,) + (1,) * (LEVELS - 1)
    expected = sum(coll.all_to_all(TOPO, fanout, 2 * shard.tokens * w) for w in widths)
    mamba = _comm(NEMOTRON_H, _first(NEMOTRON_H, "mamba", False), shard, 2, cp=2)
    assert (mamba.cp_forward, mamba.cp_backward) == pytest.approx((expected, expected))
    attention = _comm(NEMOTRON_H, _first(NEMOTRON_H, "attention", False), shard, 2, cp=2)
    assert attention.cp_backward > 0


def test_mamba_groups_are_repeated_over_cp_beyond_a_ranks_groups() -> None:
    """With fewer groups per tp rank than cp ranks, Megatron-core repeats each group's B and C
    cp / (G / t) times before the all-to-all: the B, C traffic does not shrink below one group per rank."""
    few = replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, groups=2))
    shard = Shard(tp=2, cp=4, seq_len=8192)
    layer = _first(NEMOTRON_H, "mamba", False)
    repeated = _comm(few, layer, shard, 2, cp=4).cp_forward
    split = _comm(replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, groups=8)), layer, shard, 2, cp=4).cp_forward
    assert repeated == pytest.approx(split)  # 2 / 2 groups repeated 4 times = 8 / 2 groups: 4 per rank


# ---------------------------------------------------------------- divisibility
def test_tp_must_split_the_mamba_heads_and_groups() -> None:
    """Megatron-core's MambaMixer asserts nheads % tp == 0 and ngroups % tp == 0."""
    assert tp_conflict(NEMOTRON_H, 8) is None  # 128 heads, 8 groups
    error = tp_conflict(NEMOTRON_H, 16)
    assert error is not None and "16" in str(error) and "8 Mamba groups" in str(error)
    odd = replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, num_heads=96))
    error = tp_conflict(odd, 64)
    assert error is not None  # the attention's 32 heads already refuse 64
    heads = replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, num_heads=36, groups=4))
    error = tp_conflict(heads, 8)
    assert error is not None and "36 Mamba heads" in str(error)
    assert tp_conflict(JAMBA, 8) is None and "8190 Mamba channels" in str(
        tp_conflict(replace(JAMBA, mamba=replace(JAMBA.mamba, inner=8190)), 4)
    )


def test_cp_must_split_the_mamba_heads_and_match_the_groups() -> None:
    """MambaContextParallel: heads / tp divisible by cp; groups / tp and cp divide one another."""
    assert model_conflict(ParallelDims(tp=2, cp=4), NEMOTRON_H, 8192) is None  # 4 groups per rank
    assert model_conflict(ParallelDims(tp=2, cp=8), NEMOTRON_H, 8192) is None  # repeated twice
    six = replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, groups=16, num_heads=80))
    error = model_conflict(ParallelDims(tp=2, cp=16), six, 8192)
    assert error is not None and "80 Mamba heads" in str(error)
    twelve = replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, groups=24, num_heads=192))
    error = model_conflict(ParallelDims(tp=2, cp=8), twelve, 8192)
    assert error is not None and "cp 8" in str(error) and "12 Mamba groups" in str(error)
    error = model_conflict(ParallelDims(cp=2), JAMBA, 8192)
    assert error is not None and "Mamba-1" in str(error)
    with pytest.raises(ConfigError, match="Mamba groups"):
        api.evaluate(NEMOTRON_H, CLUSTER, ParallelDims(tp=16, dp=4), api.job_for(NEMOTRON_H, CLUSTER, 64, 4096))


# ---------------------------------------------------------------- selective recomputation
def test_selective_recomputation_reruns_attention_cores_only() -> None:
    """The recomputed FLOPs are the attention cores' forward: MLA's 2 s a (d_qk + d_v) (DeepSeek-V3:
    192 and 128, not 4 s a 192; its MTP module's block too), over the causal half the kernel computes,
    and nothing for Nemotron-H's Mamba and MLP layers."""
    seq = 4096
    for spec in (DEEPSEEK, NEMOTRON_H, LLAMA):
        model, hardware = _model_flops(spec, seq, 1, Recompute.SELECTIVE)
        blocks = list(range(spec.num_layers)) + [spec.num_layers - 1] * spec.mtp_layers
        attention = [i for i in blocks if spec.mixer_of(i) == "attention"]
        expected = seq * sum(
            L.attended_fraction(spec, i, seq) * L.attention_model_flops(spec, i, seq) for i in attention
        )
        assert hardware - model == pytest.approx(expected)
    model, hardware = _model_flops(DEEPSEEK, seq, 1, Recompute.SELECTIVE)
    assert DEEPSEEK.mtp_layers == 1
    # the causal half of each layer's 2 s^2 a (d_qk + d_v)
    assert hardware - model == pytest.approx((DEEPSEEK.num_layers + 1) * seq * seq * 128 * (192 + 128))
    model, hardware = _model_flops(NEMOTRON_H, seq, 1, Recompute.SELECTIVE)
    assert hardware - model == pytest.approx(4 * 2 * seq * seq * NEMOTRON_H.q_channels)  # 4 causal attention layers


# ---------------------------------------------------------------- parameters per device
def test_mla_down_projections_latent_norms_and_router_are_replicated_over_tp() -> None:
    """Megatron-core builds MLA's down-projections duplicated on every tp rank, and the MoE router
    whole: DeepSeek-V3 at tp 8 holds h (1536 + 512 + 64) + 1536 + 512 of them whole in every layer,
    and the router's (h + 1 correction bias) x 256 in an MoE layer; the rest divides by 8."""
    h, shard = DEEPSEEK.hidden_size, Shard(tp=8)
    latent = h * (1536 + 512 + 64) + 1536 + 512
    dense, moe = _first(DEEPSEEK, "attention", True), _first(DEEPSEEK, "attention", True, moe=True)
    for layer, router in ((dense, 0), (moe, (h + 1) * 256)):
        replicated = 2 * h + latent + router  # the block's two RMSNorms, latents, router
        full = L.block_params(DEEPSEEK, layer).dense
        got = L.block_params_per_device(DEEPSEEK, layer, shard).dense
        assert got == pytest.approx((full - replicated) / 8 + replicated)
    llama = L.block_params_per_device(LLAMA, 0, shard).dense
    assert llama == pytest.approx((L.block_params(LLAMA, 0).dense - 2 * LLAMA.hidden_size) / 8 + 2 * LLAMA.hidden_size)


# ---------------------------------------------------------------- elementwise traffic
def test_llama4_no_rope_layers_neither_rotate_nor_normalise() -> None:
    """Llama 4's layers without rotary positions have no L2 QK-norm either (HF modeling_llama4): their
    elementwise traffic lacks both RoPE's and the norm's read and write of Q and K."""
    scout = api.resolve_model("llama4-scout")
    shard = Shard(tp=2, seq_len=8192)
    nope = scout.layers_where(lambda block: not block.rope)[0]
    rope = next(
        i for i in range(scout.num_layers) if scout.blocks[i].rope and scout.is_moe_layer(i) == scout.is_moe_layer(nope)
    )
    qk = 2 * 2 * shard.tokens * (scout.q_channels + scout.kv_channels) / 2

    assert _elementwise_bytes(scout, rope, shard) - _elementwise_bytes(scout, nope, shard) == pytest.approx(2 * qk)


def test_mla_latent_norms_traffic() -> None:
    """q_a_layernorm and kv_a_layernorm read and write each rank's own latents: 2 B T (q_lora +
    kv_lora) / sp; a query latent 1536 wide costs 2 B T 1536 / 8 at tp 8 with sp."""

    shard = Shard(tp=8, sp=True, seq_len=4096)
    plain_q = replace(DEEPSEEK, q_lora_rank=0)
    diff = _elementwise_bytes(DEEPSEEK, 0, shard) - _elementwise_bytes(plain_q, 0, shard)
    assert diff == pytest.approx(2 * 2 * shard.tokens * 1536 / 8)


# ---------------------------------------------------------------- exports
@pytest.mark.parametrize(
    "name, kind, framework",
    [
        ("nemotron-h-8b", "Mamba-2", "megatron-bridge"),
        ("nemotron-h-8b", "Mamba-2", "torchtitan"),
        ("jamba-1.5-mini", "Mamba-1", "megatron"),
        ("jamba-1.5-mini", "Mamba-1", "megatron-bridge"),
        ("jamba-1.5-mini", "Mamba-1", "torchtitan"),
    ],
)
def test_hybrid_stacks_are_not_exported_as_gpts(capsys, tmp_path, name: str, kind: str, framework: str) -> None:
    """A Mamba hybrid would export as a GPT of its attention layers where the framework has no hybrid
    entry point (Megatron-Bridge's recipes, torchtitan; Megatron-LM for Mamba-1, which Megatron-core lacks):
    refused, one line, exit 2, naming its Mamba layers. Megatron-LM runs Mamba-2 hybrids
    (tests/unit/test_export_hybrid.py)."""
    plan = tmp_path / "plan.json"
    code, out, err = run_cli(
        capsys,
        [
            "evaluate",
            "--model",
            name,
            "--cluster",
            "dgx-h100",
            "--devices",
            "8",
            "--tp",
            "2",
            "--dp",
            "4",
            "--global-batch-size",
            "32",
            "--seq-len",
            "2048",
            "--json",
        ],
    )
    assert code == 0, err
    plan.write_text(out)
    code, out, err = run_cli(capsys, ["export", str(plan), "--framework", framework, "--out", str(tmp_path / "x")])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    layers = ",".join(map(str, api.resolve_model(name).mamba_layers))
    assert f"{kind} mixers in layers {layers}" in err


def test_the_planner_offers_no_context_parallelism_mamba_cannot_run() -> None:
    """The search space asks cost/evaluator.py ``cp_comm_conflict`` which cp it may try: Jamba none
    (its Mamba-1 mixers have no cp, the plan crashed costing them), Nemotron-H what its groups allow."""
    from nestplan.strategy.legality import cp_comm_conflict

    job = api.job_for(JAMBA, CLUSTER, 32, 16384)
    assert "Mamba-1" in str(cp_comm_conflict(job, 2, 1, JAMBA))
    assert cp_comm_conflict(job, 1, 2, JAMBA) is None
    assert cp_comm_conflict(job, 8, 8, NEMOTRON_H) is None
    assert "Mamba heads" in str(
        cp_comm_conflict(job, 8, 4, replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, num_heads=48, groups=4)))
    )


def test_jambas_ffn_sync_hides_under_the_ffns_gemms_not_the_mixers_local_ones() -> None:
    """A Jamba block lists in_proj, out_proj, x_proj, dt_proj, then the MLP's pair: GEMMs x_proj and
    dt_proj (local, no sync of their own) hide nothing; the MLP's pair hides the FFN's sync."""
    shard = Shard(tp=2, sp=True, seq_len=4096)
    layer = _first(JAMBA, "mamba", True)
    names = len(L.block_gemms(JAMBA, layer, shard))
    assert names == 6
    groups = _groups(2)
    plain = _comm(JAMBA, layer, shard, 2).tp_forward
    local_only = [(1.0, 2.0) if i in (2, 3) else (0.0, 0.0) for i in range(names)]
    got = comm.block_comm(TOPO, JAMBA, layer, shard, groups, 0.0, local_only, tp_overlap=True).tp_forward
    assert got == pytest.approx(plain)
    ffn_only = [(1.0, 2.0) if i in (4, 5) else (0.0, 0.0) for i in range(names)]
    got = comm.block_comm(TOPO, JAMBA, layer, shard, groups, 0.0, ffn_only, tp_overlap=True).tp_forward
    assert got < plain


def test_mlas_latent_gather_hides_under_the_key_value_up_projection_too() -> None:
    """Under tp overlap MLA's gather feeds its query and key/value up-projections (``block_gemms``: the
    first and the last GEMM): a long key/value up-projection hides it."""
    shard = Shard(tp=8, sp=True, seq_len=4096)
    layer = _first(DEEPSEEK, "attention", True)
    count = len(L.block_gemms(DEEPSEEK, layer, shard))
    plain = _comm(DEEPSEEK, layer, shard, 8).tp_forward
    kv_up = [(1.0, 2.0) if i == count - 1 else (0.0, 0.0) for i in range(count)]
    got = comm.block_comm(TOPO, DEEPSEEK, layer, shard, _groups(8), 0.0, kv_up, tp_overlap=True).tp_forward
    assert got < plain


def test_plan_with_export_refuses_a_model_the_framework_cannot_build_before_searching(capsys, tmp_path) -> None:
    """`plan --export megatron` of a Mamba-1 hybrid (Jamba): the export's one-line refusal, before any search
    (no search line, no plan written)."""
    code, out, err = run_cli(
        capsys,
        [
            "plan",
            "--model",
            "jamba-1.5-mini",
            "--cluster",
            "dgx-h100",
            "--devices",
            "64",
            "--global-batch-size",
            "512",
            "--export",
            "megatron",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "hybrid stack" in err
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())
