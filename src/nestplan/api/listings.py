"""The catalog's listings: its models, accelerators and clusters by name or with their sizes and sources."""

from __future__ import annotations

from typing import Any

from nestplan.cluster import load_cluster
from nestplan.errors import ConfigError, printable
from nestplan.model import load_model
from nestplan.units import GiB


CATALOG_KINDS = ("models", "accelerators", "clusters")


def catalog_names(kind: str) -> list[str]:
    """Names in the catalog: 'models', 'accelerators' or 'clusters'."""
    from nestplan.cluster import cluster_names
    from nestplan.hardware import accelerator_names
    from nestplan.model import model_names

    listers = {"models": model_names, "accelerators": accelerator_names, "clusters": cluster_names}
    return listers[_catalog_kind(kind)]()


def _catalog_kind(kind: str) -> str:
    key = kind.strip().lower()
    if key not in CATALOG_KINDS:
        raise ConfigError(
            f"cannot list '{printable(kind)}'; choose one of: {', '.join(CATALOG_KINDS)}",
            field="kind",
            value=printable(kind),
            limit=list(CATALOG_KINDS),
        )
    return key


def catalog_entries(kind: str) -> list[dict[str, Any]]:
    """The catalog's 'models', 'accelerators' or 'clusters', one dict each: name, sizes, source."""
    key = _catalog_kind(kind)
    describe = {"models": _model_entry, "accelerators": _accelerator_entry, "clusters": _cluster_entry}[key]
    return [describe(name) for name in catalog_names(key)]


def _model_entry(name: str) -> dict[str, Any]:
    from nestplan.catalog import entry_path
    from nestplan.inputs import load_object
    from nestplan.model.layers import total_params

    spec = load_model(name)
    return {
        "name": name,
        "family": spec.family,
        "layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "parameters_B": total_params(spec) / 1e9,
        "experts": spec.num_experts,
        "max_position_embeddings": spec.max_position_embeddings,
        "source": str(load_object(entry_path("model", name), "model config").get("_source", "")),
    }


def _accelerator_entry(name: str) -> dict[str, Any]:
    from nestplan.hardware import load_accelerator

    acc = load_accelerator(name)
    return {
        "name": name,
        "peak_TFLOPS": {dtype: flops / 1e12 for dtype, flops in acc.peak_flops.items()},
        "hbm_GiB": acc.hbm_bytes / GiB,
        "hbm_bandwidth_TBps": acc.hbm_bandwidth_Bps / 1e12,
        "source": acc.source,
    }


def _cluster_entry(name: str) -> dict[str, Any]:
    from nestplan.cluster import cluster_data

    cl = load_cluster(name)
    return {
        "name": name,
        "accelerator": cl.accelerator.name,
        "devices": cl.devices,
        "levels": [{"name": lv.name, "size": lv.size} for lv in cl.topology.levels],
        "source": str(cluster_data(name).get("source", "")),
    }
