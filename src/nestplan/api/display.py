"""How results show: the one-line repr of an evaluation or a plan report, the heading of its HTML."""

from __future__ import annotations

import html

from nestplan.cluster import Cluster
from nestplan.cost.prediction import Prediction
from nestplan.errors import printable
from nestplan.model import ModelSpec
from nestplan.strategy.describe import describe


NAME_WIDTH = 24  # characters of a model's or a cluster's name in a one-line repr


def short(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` printable and cut to ``width`` characters."""
    text = printable(name)
    return text if len(text) <= width else text[: width - 3] + "..."


def summary(model: ModelSpec, cluster: Cluster, pred: Prediction) -> str:
    """One line: what ran where, the plan and its headline figures."""
    return (
        f"{short(model.name)} on {short(cluster.name)}: {describe(pred.plan)}, step {pred.step_time_s:.4g} s, "
        f"{pred.tokens_per_s:,.0f} tokens/s, MFU {pred.mfu:.1%}, {'fits' if pred.fits else 'does NOT fit'}"
    )


def heading(model: ModelSpec, cluster: Cluster, what: str) -> str:
    return (
        f"<h4>{html.escape(model.name)} on {html.escape(cluster.name)} "
        f"({cluster.devices:,} devices): {html.escape(what)}</h4>"
    )
