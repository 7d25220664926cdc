"""The launch script's placement parts for Megatron-LM where its rank order is not the costed one: the
shell lines that give each node the torchrun node rank of node_ranks.txt, or start every rank as a SLURM
task on the node rank_nodes.txt names (export.rank_order), and the note that says which."""

from __future__ import annotations

from typing import Sequence

from nestplan.export import rank_order
from nestplan.plan import Plan


def placement_note(plan: Plan, megatron_order: Sequence[str], file_name: str) -> str:
    """What the node order or the per-rank placement does, where Megatron-LM's order (``megatron_order``)
    is not the costed one."""
    order = "-".join(megatron_order)
    if file_name == rank_order.FILE_NAME:
        return (
            f"Megatron-LM numbers ranks {order}, not the costed {'-'.join(plan.axis_order)}: {file_name} gives "
            "each node the torchrun node rank that puts its ranks on the devices nestplan costed them on "
            "(the groups are the costed ones)"
        )
    return (
        f"no node order maps Megatron-LM's {order} onto the costed {'-'.join(plan.axis_order)}: under sbatch the "
        f"script starts every rank as its own task on the node {file_name} names (SLURM_HOSTFILE, srun "
        "--distribution=arbitrary), so each group spans the nodes nestplan costed; run any other way, torchrun "
        "keeps Megatron-LM's order, as the rank-layout note says"
    )


def node_order_lines() -> str:
    """Shell lines that set torchrun's node rank from node_ranks.txt and this node's place in the allocation."""
    return (
        f"# node order ({rank_order.FILE_NAME}): each node starts the torchrun node rank that puts its ranks\n"
        "# on the devices nestplan costed them on. NODE_INDEX: this node's place in network order\n"
        'NODE_INDEX="${NODE_INDEX:-${SLURM_NODEID:-0}}"\n'
        f'mapfile -t NODE_RANKS < <(grep -v "^#" "$(dirname "${{BASH_SOURCE[0]}}")/{rank_order.FILE_NAME}")\n'
        'if [[ ! "$NODE_INDEX" =~ ^[0-9]+$ ]] || (( NODE_INDEX >= ${#NODE_RANKS[@]} )); then\n'
        f'  echo "NODE_INDEX $NODE_INDEX is not a node of {rank_order.FILE_NAME}" >&2\n'
        "  exit 2\n"
        "fi\n"
        'NODE_RANK="${NODE_RANKS[NODE_INDEX]}"\n'
    )


def rank_placement_lines(devices_per_node: int) -> str:
    """Shell lines that, under sbatch, start every rank as its own SLURM task on the node
    rank_nodes.txt names (SLURM_HOSTFILE read by srun --distribution=arbitrary); elsewhere the script
    goes on to torchrun, node by node, in Megatron-LM's own order."""
    name = rank_order.RANK_FILE_NAME
    return (
        f"# rank placement ({name}): under sbatch, rank r runs as SLURM task r on the node line r names;\n"
        "# run any other way, torchrun starts the ranks node by node in Megatron-LM's own order (see the notes)\n"
        'if [[ -n "${SLURM_JOB_ID:-}" && -z "${SLURM_STEP_ID:-}" ]]; then\n'
        '  mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")\n'
        f'  mapfile -t RANK_NODE < <(grep -v "^#" "$(dirname "${{BASH_SOURCE[0]}}")/{name}")\n'
        '  SLURM_HOSTFILE="$(mktemp)"\n'
        '  for node in "${RANK_NODE[@]}"; do printf "%s\\n" "${HOSTS[node]}"; done > "$SLURM_HOSTFILE"\n'
        "  export SLURM_HOSTFILE NESTPLAN_RANK_TASKS=1\n"
        f'  exec srun --ntasks="${{#RANK_NODE[@]}}" --distribution=arbitrary --gpus-per-node={devices_per_node} '
        'bash "$0" "$@"\n'
        "fi\n"
    )


def one_process_per_task() -> str:
    """After the torchrun prologue: in a task of that srun, SLURM started the rank, which runs Megatron-LM itself."""
    return (
        'if [[ -n "${NESTPLAN_RANK_TASKS:-}" ]]; then\n'
        '  export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS" MASTER_ADDR MASTER_PORT\n'
        "  TORCHRUN=(python3)   # one process per SLURM task\n"
        "fi\n"
    )
