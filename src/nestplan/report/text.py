"""Readable output of one plan (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from nestplan.cost.prediction import Prediction
from nestplan.units import GiB


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def render_plan(console: Console, plan: dict, pred: Prediction) -> None:
    """Print the plan, its stage table, the step-time and memory breakdowns, and a fit verdict."""
    par, p = plan["parallel"], plan["prediction"]
    console.print(f"[bold]{plan['model']}[/] on [bold]{plan['cluster']}[/]: {plan['devices_used']} of "
                  f"{plan['devices_total']} devices, global batch {plan['job']['global_batch_size']}, "
                  f"sequence {plan['job']['seq_len']}, {plan['job']['dtype']}")
    console.print(f"plan: tp {par['tp']}{' +sp' if par['sp'] else ''}, cp {par['cp']}, ep {par['ep']}, "
                  f"pp {par['pp']}, dp {par['dp']}, ZeRO {par['zero_stage']}, recompute {par['recompute']}, "
                  f"microbatch {par['micro_batch_size']} x {par['num_microbatches']}, schedule {par['schedule']}"
                  + (f" (v={par['virtual_stages']})" if par['virtual_stages'] > 1 else ""))
    names = plan["placement"]["level_names"]
    spans = ", ".join(f"{k} {names[v]}" for k, v in plan["placement"]["levels_spanned"].items() if par[k] > 1)
    console.print(f"placement: axis order {'-'.join(plan['placement']['axis_order'])} (fastest first); groups span: {spans}")
    console.print(f"step time [bold]{p['step_time_s']:.4f} s[/], {p['tokens_per_s']:,.0f} tokens/s, "
                  f"{p['model_tflops_per_device']:.1f} model TFLOP/s per device (MFU {p['mfu']:.1%}), "
                  f"{p['hardware_tflops_per_device']:.1f} hardware TFLOP/s")
    table = Table(title="stages (per microbatch, per device)")
    for col in ("stage", "layers", "devices", "fwd ms", "bwd ms", "cycle ms", "memory GiB"):
        table.add_column(col, justify="right")
    for i, s in enumerate(plan["stages"]):
        extra = ("E+" if s["embedding"] else "") + f"{s['layers'][0]}-{s['layers'][1]}" + ("+H" if s["head"] else "")
        table.add_row(str(i), extra, str(s["devices"]), _ms(s["forward_s"]), _ms(s["backward_s"]),
                      _ms(s["time_s"]), _gib(s["memory_bytes"]))
    console.print(table)
    bd = Table(title="step time breakdown")
    bd.add_column("term")
    bd.add_column("seconds", justify="right")
    bd.add_column("share", justify="right")
    for key, val in p["breakdown_s"].items():
        if val > 0:
            bd.add_row(key, f"{val:.4f}", f"{val / p['step_time_s']:.1%}")
    mem = Table(title=f"memory of the fullest stage (capacity {_gib(p['memory_capacity_bytes'])} GiB)")
    mem.add_column("term")
    mem.add_column("GiB", justify="right")
    for key, val in p["memory_breakdown_bytes"].items():
        mem.add_row(key, _gib(val))
    mem.add_row("[bold]total[/]", _gib(p["peak_memory_bytes_per_device"]))
    console.print(bd)
    console.print(mem)
    if not p["fits"]:
        worst = max(p["memory_breakdown_bytes"].items(), key=lambda kv: kv[1])
        console.print(f"[bold red]does not fit:[/] {_gib(p['peak_memory_bytes_per_device'])} GiB per device exceeds "
                      f"{_gib(p['memory_capacity_bytes'])} GiB by {_gib(p['memory_excess_bytes'])} GiB; "
                      f"largest term: {worst[0]} ({_gib(worst[1])} GiB)")


def _describe(pred: Prediction) -> str:
    d = pred.plan
    parts = [f"tp {d.tp}{'+sp' if d.sp_active else ''}", f"pp {d.pp}", f"dp {d.dp}"]
    if d.cp > 1:
        parts.append(f"cp {d.cp}")
    if d.ep > 1:
        parts.append(f"ep {d.ep}")
    parts += [f"mbs {d.micro_batch_size}", f"ZeRO {int(d.zero)}", f"rc {d.recompute.value}"]
    if d.virtual_stages > 1:
        parts.append(f"v {d.virtual_stages}")
    parts.append("-".join(pred.placement.axis_order))
    return ", ".join(parts)


def why_lost(best: Prediction, other: Prediction) -> str:
    """The step-time term that grew most against the best plan."""
    if other.step_time_s <= best.step_time_s * (1 + 1e-9):
        return "tie: same predicted time"
    deltas = {k: other.breakdown_s[k] - best.breakdown_s.get(k, 0.0) for k in other.breakdown_s}
    term = max(deltas, key=deltas.get)
    return f"{term} +{deltas[term]:.3f} s"


def render_runners_up(console: Console, best: Prediction, others: tuple[Prediction, ...]) -> None:
    if not others:
        return
    table = Table(title="runner-up plans")
    for col in ("plan", "step s", "vs best", "why it lost", "memory GiB"):
        table.add_column(col, justify="right" if col != "plan" else "left")
    for pred in others:
        table.add_row(_describe(pred), f"{pred.step_time_s:.3f}", f"+{pred.step_time_s / best.step_time_s - 1:.1%}",
                      why_lost(best, pred), _gib(pred.peak_memory_bytes_per_device))
    console.print(table)
