"""Jobs on whole hosts: which devices of a network a job of N devices takes.

A host (a server, a GB200 compute tray) is what launchers and schedulers count: torchrun's
``--nproc-per-node``, Slurm's nodes. It is not a network level: a GB200 NVL72 rack is one NVLink 5 domain
of 72 GPUs built from 18 hosts of 4 (NVIDIA DGX SuperPOD Reference Architecture featuring DGX GB200).
Hosts lie inside one unit of the innermost level (the **domain**: a DGX node, an NVL72 rack).

A job takes whole hosts (a job of one host may take part of it), and the same number of them in every
domain it uses, so that the network it runs on is again uniform levels (``Topology``): its devices per
domain, ``per_domain``, divide it. Unless the user says how many devices to use per domain
(``gpus_per_domain``), a job that does not fill its domains uses the most whole hosts per domain that
divide it (128 GPUs on 72-GPU racks: 2 racks x 64; 256: 4 x 64; 512: 8 x 64). That is what Slurm's block
topology gives with ``--segment``, and what NVIDIA's benchmark launcher asks for on GB200 and GB300:
"the greatest divisor of the node count that fits within the 18-node NVLink domain" (NVIDIA
dgxc-benchmarking, cli/llmb-run job_launcher.py ``_compute_segment_size`` and CHANGELOG 1.10.2; its
v25.05.01 launch scripts run GB200 at 4 GPUs per node, llama3.1/launch.sh ``DEF_GPUS_PER_NODE=4``).
Filling domains in order (72 + 56) would make the domains unequal, which the levels cannot describe.
"""

from __future__ import annotations

from dataclasses import replace

from nestplan.errors import ConfigError
from nestplan.network.topology import MAX_DEVICES, Topology

NEAREST_SCAN = 4096  # candidate counts tried on each side of a refused one for the nearest valid counts


def check_hosts(topology: Topology, gpus_per_host: int | None, gpus_per_domain: int | None) -> None:
    """ConfigError unless a host lies inside one domain (``gpus_per_host`` divides the innermost level's
    size) and ``gpus_per_domain`` is a whole number of hosts within a domain."""
    domain = topology.levels[0]
    host = domain.size if gpus_per_host is None else gpus_per_host
    if gpus_per_host is not None and not (1 <= host <= MAX_DEVICES and domain.size % host == 0):
        raise ConfigError(
            f"cluster '{topology.name}': gpus_per_host must divide the {domain.size} devices of its innermost "
            f"level '{domain.name}' (a host lies inside one {domain.name}), got {gpus_per_host}",
            field="gpus_per_host",
            value=gpus_per_host,
            limit=f"a divisor of {domain.size}",
        )
    if gpus_per_domain is not None and not (1 <= gpus_per_domain <= domain.size and gpus_per_domain % host == 0):
        raise ConfigError(
            f"cluster '{topology.name}': GPUs used per {domain.name} (gpus_per_domain, --gpus-per-domain) must be "
            f"a multiple of its {host} GPUs per host up to {domain.size}, got {gpus_per_domain}",
            field="gpus_per_domain",
            value=gpus_per_domain,
            limit=f"a multiple of {host} in {host}..{domain.size}",
        )


def _per_domain(topology: Topology, devices: int, host: int, given: int | None) -> tuple[int | None, str]:
    """(devices the job uses per domain, "") or (None, why ``devices`` cannot be placed)."""
    domain = topology.levels[0]
    total = topology.devices
    if not 1 <= devices <= total:
        return None, f"is outside 1..{total} for cluster '{topology.name}'"
    if devices <= host:
        return devices, ""
    if devices % host:
        return None, (
            f"is not a multiple of {host} (GPUs per host of cluster '{topology.name}'; a job takes whole hosts)"
        )
    share = given if given is not None else domain.size
    if devices <= share:
        return devices, ""
    if given is not None and devices % given:
        return None, f"is not a multiple of the {given} GPUs used per {domain.name} (gpus_per_domain)"
    if given is None:
        share = max(d for d in range(host, domain.size + 1, host) if devices % d == 0)
    units = total // domain.size
    if devices // share > units:
        return None, (f"needs {devices // share} {domain.name}s of {share} GPUs; cluster '{topology.name}' has {units}")
    return share, ""


def nearest_counts(topology: Topology, devices: int, host: int, given: int | None) -> list[int]:
    """The nearest device counts below and above ``devices`` that ``take`` places (at most one each)."""
    top = min(devices - 1, topology.devices)
    below = range(top, max(top - NEAREST_SCAN, 0), -1)
    above = range(max(devices + 1, 1), min(devices + NEAREST_SCAN, topology.devices) + 1)
    found = [
        next((c for c in counts if _per_domain(topology, c, host, given)[0] is not None), None)
        for counts in (below, above)
    ]
    return [c for c in found if c is not None]


def take(topology: Topology, devices: int, host: int, given: int | None = None) -> tuple[Topology, int]:
    """The network a job of ``devices`` devices runs on (its domains ``per_domain`` devices each, outer
    levels as ``Topology.truncate`` keeps them) and ``per_domain``; a ConfigError naming the nearest
    valid counts where the job cannot take whole hosts, equally many in each domain it uses."""
    share, why = _per_domain(topology, devices, host, given)
    if share is None:
        near = nearest_counts(topology, devices, host, given)
        listed = ", ".join(map(str, near))
        raise ConfigError(
            f"--devices {devices} {why}; nearest valid count{'s' if len(near) > 1 else ''}: {listed}",
            field="devices",
            value=devices,
            limit=near,
        )
    domain = topology.levels[0]
    if share < domain.size and devices > share:
        topology = Topology(topology.name, (replace(domain, size=share),) + topology.levels[1:])
    return topology.truncate(devices), share
