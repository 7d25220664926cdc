"""Running sweep cases on a Ray cluster (optional extra ``nestplan[ray]``).

``address``: ``local`` starts a Ray instance on this machine for the sweep; ``auto`` joins the
cluster this machine belongs to; ``ray://host:port`` connects a client to a remote head. The
models and cluster variants are put in the object store once and passed by reference.
"""

from __future__ import annotations

from typing import Any, Callable

from nestplan.errors import ConfigError


def _connect(ray, address: str) -> bool:
    """Initialise Ray; True when this call started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    if address == "local":
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    elif address == "auto" or address.startswith("ray://") or ":" in address:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    else:
        raise ConfigError(
            f"--ray must be local, auto, ray://host:port or host:port, got '{address}'",
            field="ray",
            value=address,
            limit="local | auto | ray://host:port",
        )
    return True


def run_on_ray(
    jobs: list[tuple], address: str, solve: Callable[..., dict], record: Callable[[dict, dict], None]
) -> None:
    """``solve(inputs, model, cluster)`` of every job as a Ray task; ``record(inputs, result)`` as each ends."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray needs Ray: pip install 'nestplan[ray]'", field="ray", value=address, limit="ray installed"
        ) from None
    started = _connect(ray, address)
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(solve)
        shared: dict[int, Any] = {}

        def ref(obj):  # one object-store entry per distinct model or cluster variant
            if id(obj) not in shared:
                shared[id(obj)] = ray.put(obj)
            return shared[id(obj)]

        running = {task.remote(inputs, ref(model), ref(cluster)): inputs for inputs, model, cluster in jobs}
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            for r in ready:
                inputs = running.pop(r)
                try:
                    result = ray.get(r)
                except Exception as exc:  # a worker that died beyond its retries
                    result = {"status": "error", "error": f"ray task failed: {type(exc).__name__}", "solve_time_s": 0.0}
                record(inputs, result)
    finally:
        if started:
            ray.shutdown()
