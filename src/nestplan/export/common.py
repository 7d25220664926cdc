"""Shared by the exporters: the files an export writes, its header, the rank layout, the launcher.

Every export opens with a comment header that states the nestplan version, the plan
and its prediction, and every note an exporter raises (a feature the framework runs
differently from how nestplan costed it, or a rank layout it cannot express).
Exporters raise ``ConfigError`` instead where the plan cannot be launched as costed.

Names in a plan come from files a user may not have written (a model's ``config.json``, a
cluster file): nothing from them may run when a generated script runs. Every text a script
puts on a comment line goes through :func:`comment_text` (one line, control characters
escaped) and every value on a command line or in an assignment through :func:`shell_word`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from nestplan import outputs
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.kernels import FRAMEWORK_ATTENTION
from nestplan.errors import ConfigError, printable
from nestplan.export.plan import ExportInput
from nestplan.plan import Plan
from nestplan.settings import Framework
from nestplan.strategy.describe import describe
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule
from nestplan.strategy.placement import (
    REPLICA_MAJOR as REPLICA_MAJOR,
)
from nestplan.strategy.placement import (
    STAGE_MAJOR as STAGE_MAJOR,
)
from nestplan.strategy.placement import (
    consecutive_span_level,
)
from nestplan.units import GiB


@dataclass(frozen=True)
class ExportFile:
    name: str
    text: str
    executable: bool = False


class Handling(str, Enum):
    """What an exporter does with a run setting that differs from its default (``settings.RunSettings``)."""

    SETS = "sets"  # writes the framework's own flag or config key for it (and may note what differs)
    NOTES = "notes"  # the framework runs it its own way: a note says so, with nestplan's prediction where it can
    REFUSES = "refuses"  # the framework cannot run it: the export refuses the plan in one line


@dataclass(frozen=True)
class SettingSupport:
    """One exporter's declaration for one run setting: its handling and, in a few words, how (the flag or
    key it sets, or what the note or refusal says)."""

    handling: Handling
    how: str


def sets(how: str) -> SettingSupport:
    return SettingSupport(Handling.SETS, how)


def notes(how: str) -> SettingSupport:
    return SettingSupport(Handling.NOTES, how)


def refuses(how: str) -> SettingSupport:
    return SettingSupport(Handling.REFUSES, how)


@dataclass(frozen=True)
class Export:
    """An export: its files and the notes its header carries (also for callers to print)."""

    framework: str
    files: tuple[ExportFile, ...]
    notes: tuple[str, ...]

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write the files into ``out_dir`` (created if missing), all or none, modes set before they move in
        (nestplan.outputs.staged: a link where a file would go is refused); returns their paths."""
        folder = Path(out_dir)
        with outputs.staged(folder, "--out") as stage:
            for f in self.files:
                (stage / f.name).write_text(f.text)
                (stage / f.name).chmod(outputs.file_mode(f.executable))
        return [folder / f.name for f in self.files]


def comment_text(text: object) -> str:
    """``text`` as it may stand on one comment line of a generated file: every control character
    written as an escape, so that no newline ends the comment and starts a command."""
    line = printable(str(text))
    assert "\n" not in line and "\r" not in line, "printable() must escape line breaks"
    return line


def shell_word(value: object) -> str:
    """``value`` as one shell word that the shell takes literally (no expansion, no second command)."""
    return shlex.quote(str(value))


def refuse(framework: str, what: str, field: str, value: object, limit: object = None) -> ConfigError:
    """The error for a plan the framework cannot launch as nestplan costed it."""
    return ConfigError(f"cannot export to {framework}: {what}", field=field, value=value, limit=limit)


def schedule_refusal(
    framework: str, name: str, plan: Plan, runs: ParallelDims, costed: Sequence[Schedule]
) -> ConfigError:
    """The error for a plan whose pipeline schedule ``framework`` (exported as ``name``; it runs ``costed``)
    does not run, as issue 16 decided: an export runs what was costed, or refuses. The line names the
    schedule the framework would run instead (``runs``: the plan's degrees and stage split under it) and
    nestplan's prediction of that plan, so that the user can take it or plan for the framework."""
    d = plan.dims
    other = evaluate_plan(plan.model, plan.cluster, runs, plan.job, plan.axis_order)
    chunks = f" with {runs.virtual_stages} chunks per stage" if runs.virtual_stages > 1 else ""
    split = f",layers_per_stage={counts_text(runs.layers_per_stage)}" if runs.layers_per_stage else ""
    return refuse(
        framework,
        f"it has no {d.schedule.value} schedule and would run {runs.schedule.value}{chunks} on the same degrees "
        f"and stages, for which nestplan predicts step {other.step_time_s:.3f} s ({other.tokens_per_s:,.0f} "
        f"tokens/s) where the {d.schedule.value} plan's is {plan.predicted.step_time_s:.3f} s; evaluate it with "
        f"nestplan evaluate --plan PLAN.json --set schedule={runs.schedule.value}{split}, or plan with --export {name}",
        "schedule",
        d.schedule.value,
        [s.value for s in costed],
    )


def counts_text(counts: Sequence[int]) -> str:
    """Counts as ``--layers-per-stage`` reads them: three or more equal in a row as NxK (1,2x62,1)."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}x{k}" if k >= 3 else ",".join([str(n)] * k) for n, k in runs)


def dims_text(plan: Plan) -> str:
    """The header's parallelism: the plan's degrees and settings (the long form of every report), its
    microbatches per step and its layers per stage."""
    d = plan.dims
    if d.per_virtual_stage:
        split = f"layers per virtual stage {counts_text(d.layers_per_stage or ())}"
    else:
        split = f"layers per stage {','.join(map(str, d.layers_per_stage or ()))}"
    return f"{describe(d, long=True)}; {plan.num_microbatches} microbatches; {split}"


def prediction_text(plan: Plan) -> str:
    p = plan.predicted
    return (
        f"step {p.step_time_s:.3f} s, {p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}, peak memory "
        f"{p.peak_memory_bytes_per_device / GiB:.1f} of {p.memory_capacity_bytes / GiB:.1f} GiB per device"
    )


def stack_notes(plan: Plan, runs: Framework) -> list[str]:
    """Notes for a plan costed for other software than the export launches (``runs``): another framework's
    kernels and defaults, or an attention kernel other than the one ``runs`` picks (cost/kernels.py)."""
    settings, out = plan.job.settings, []
    if settings.framework is not runs:
        out.append(
            f"the plan was costed for {settings.framework.value}'s kernels and defaults, and this export runs "
            f"{runs.value}: plan or evaluate with --framework {runs.value} for its prediction"
        )
    kernel = settings.attention_kernel
    if kernel is not None and kernel is not FRAMEWORK_ATTENTION[runs]:
        out.append(
            f"costed with the {kernel.value} attention kernel; {runs.value} picks its own backend "
            f"({FRAMEWORK_ATTENTION[runs].value} unless its environment selects another)"
        )
    return out


def header(inp: ExportInput, framework: str, pin: str, notes: Sequence[str], prefix: str = "# ") -> str:
    """The comment block every export opens with."""
    p, job = inp.plan, inp.plan.job
    lines = [
        f"nestplan {inp.version} export for {framework} ({pin})",
        (
            f"plan: {p.model.name} on {p.cluster.name}, {p.devices_used} devices = {inp.nodes} nodes x "
            f"{inp.devices_per_node}; global batch {job.global_batch_size} x {job.seq_len} tokens, {job.dtype}"
        ),
        f"parallelism: {dims_text(p)}",
        (
            f"rank order costed (fastest first): {'-'.join(p.axis_order)}; ranks are numbered node by node "
            f"(global rank = node rank x {inp.devices_per_node} + local rank), nodes in network order "
            f"({node_order_text(inp)})"
        ),
        f"predicted by nestplan: {prediction_text(p)}",
    ]
    lines += [f"note: {n}" for n in notes]
    return "".join(f"{prefix}{comment_text(line)}\n" for line in lines)


def node_order_text(inp: ExportInput) -> str:
    """Which consecutive nodes share each level (an NVL72 rack of several nodes included), as nestplan's
    placement assumes."""
    parts = []
    for name, unit in zip(inp.level_names, inp.level_unit_devices):
        nodes = unit // inp.devices_per_node
        if nodes > 1 and unit < inp.plan.devices_used:
            parts.append(f"each {nodes} consecutive nodes share a {name}")
    spanning = consecutive_span_level(inp.plan.devices_used, inp.level_unit_devices)
    return "; ".join(parts + [f"one {inp.level_names[spanning]} holds them all"])


def rank_order_note(framework: str, inp: ExportInput, used: Sequence[str]) -> str | None:
    """A note when the framework lays ranks out in another order than the one nestplan costed."""
    p = inp.plan
    if _equivalent(p, tuple(used), p.axis_order):
        return None
    note = (
        f"RANK LAYOUT DIFFERS: {framework} orders ranks {'-'.join(used)} (fastest first), nestplan costed "
        f"{'-'.join(p.axis_order)}"
    )
    if inp.alternative is not None:
        note += (
            f"; under {'-'.join(used)} nestplan predicts step {inp.alternative['step_time_s']:.3f} s "
            f"({inp.alternative['tokens_per_s']:,.0f} tokens/s) instead of {p.predicted.step_time_s:.3f} s"
        )
    return note + f" (nestplan evaluate ... --axis-order {','.join(used)})"


def expert_group_note(framework: str, inp: ExportInput, stride: int, size: int, etp: int | None = None) -> str | None:
    """A note when the framework's expert-parallel group (``size`` ranks ``stride`` apart) is not the
    set of ranks nestplan costed (strategy.placement's "expert" group): ep ranks spaced by the degrees
    of the axes ordered before ep, each with the tp / etp ranks of its tp group that fold into expert
    parallelism (``etp``: the plan's own unless given, for a framework that runs another). Names the
    network level each spans: the expert all-to-all's cost depends on that level."""
    p, d = inp.plan, inp.plan.dims
    etp = d.expert_tp if etp is None else etp
    costed = 1
    for axis in p.axis_order[: p.axis_order.index("ep")]:
        costed *= d.degree(axis)
    ours = sorted(t * etp + k * costed for t in range(d.tp // etp) for k in range(d.ep))
    theirs = [k * stride for k in range(size)]
    if len(ours) == 1 or ours == theirs:
        return None
    level_ours, level_theirs = _level(inp, ours[-1] + 1), _level(inp, theirs[-1] + 1)
    same = (
        "the same level, so the all-to-all costs what nestplan costed"
        if level_ours == level_theirs
        else "another level: the expert all-to-all will not cost what nestplan costed"
    )
    tp = f", each with {d.tp // etp} ranks of its tp group" if etp < d.tp else ""
    return (
        f"{framework}'s expert-parallel group is {size} ranks {stride} apart (within a {level_theirs}); nestplan "
        f"costed ep {d.ep} ranks {costed} apart{tp} (within a {level_ours}): {same}"
    )


def _level(inp: ExportInput, span: int) -> str:
    """The innermost network level whose unit holds ``span`` consecutive ranks (from an aligned start)."""
    return inp.level_names[consecutive_span_level(span, inp.level_unit_devices)]


def _equivalent(p: Plan, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Two orders give the same rank grid when they agree after dropping axes of degree 1."""
    keep = [axis for axis in a if p.dims.degree(axis) > 1]
    return keep == [axis for axis in b if p.dims.degree(axis) > 1]


def choose_order(p: Plan, supported: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """The framework order equivalent to the costed one, else the framework's default (the first)."""
    for order in supported:
        if _equivalent(p, order, p.axis_order):
            return order
    return tuple(supported[0])


def torchrun_prologue(inp: ExportInput, port: int = 29500) -> str:
    """Shell lines that start one copy per node under SLURM and set the torchrun rendezvous."""
    return (
        f"NNODES={shell_word(inp.nodes)}\n"
        f"GPUS_PER_NODE={shell_word(inp.devices_per_node)}\n"
        "# under sbatch, start one copy of this script per node; under srun (or by hand) run the body\n"
        'if [[ -n "${SLURM_JOB_ID:-}" && -z "${SLURM_STEP_ID:-}" ]]; then\n'
        '  exec srun --nodes="$NNODES" --ntasks-per-node=1 bash "$0" "$@"\n'
        "fi\n"
        'NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"\n'
        'if [[ -z "${MASTER_ADDR:-}" && -n "${SLURM_JOB_NODELIST:-}" ]]; then\n'
        '  MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
        "fi\n"
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"\n'
        f'MASTER_PORT="${{MASTER_PORT:-{port}}}"\n'
        'TORCHRUN=(torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK"\n'
        '          --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")\n'
    )


def sbatch_lines(inp: ExportInput) -> str:
    """SLURM's directives (comment lines to bash, read by sbatch). Where an NVLink domain holds several
    nodes (GB200 NVL72: 18 trays of 4 GPUs), ``--segment`` asks Slurm's block topology for the nodes in
    blocks of the costed nodes per domain, each block inside one domain (the number NVIDIA's GB200
    launcher passes, dgxc-benchmarking cli/llmb-run job_launcher.py ``_compute_segment_size``)."""
    options = [f"--nodes={inp.nodes}", "--ntasks-per-node=1", f"--gpus-per-node={inp.devices_per_node}", "--exclusive"]
    if inp.level_unit_devices[0] > inp.devices_per_node:
        options.append(f"--segment={inp.nodes_per_domain}")
    return "".join(f"#SBATCH {comment_text(option)}\n" for option in options)


def bash_array(name: str, items: Sequence[str], comment: str = "") -> str:
    """A bash array assignment, one flag (with its value) per line; ``items`` are shell text
    already (from :func:`flag_pairs` or :func:`shell_word`)."""
    head = f"# {comment_text(comment)}\n" if comment else ""
    body = "".join(f"  {item}\n" for item in items)
    return f"{head}{name}=(\n{body})\n"


def flag_pairs(flags: Sequence[tuple[str, object]]) -> list[str]:
    """('--x', 3) -> '--x 3'; ('--y', None) -> '--y' (a switch); ('--z', (2, 4)) -> '--z 2 4' (a flag of
    several values); each value one literal shell word."""

    def words(value: object) -> str:
        return " ".join(shell_word(v) for v in value) if isinstance(value, tuple) else shell_word(value)

    return [name if value is None else f"{name} {words(value)}" for name, value in flags]
