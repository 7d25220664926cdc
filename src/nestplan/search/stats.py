"""What a search did: its time and its counters, kept by the engine as it runs and by a plan.

A module of its own, without imports, so that the typed plan (``nestplan.plan``) holds one without
loading the search."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SearchStats:
    """What a search did, counted as it runs. A plan keeps the first three (its plan JSON's search
    section; an evaluation: its time, one candidate, nothing pruned)."""

    solve_time_s: float = 0.0
    candidates: int = 0  # splits whose full proxy was computed
    pruned_memory: int = 0  # depths where no split fits in memory
    configurations: int = 0  # sub-graph configurations (tp, sp, cp, ep, microbatch, recomputation, rank order)
    groups: int = 0  # groups searched (their tables built, every depth solved)
    skipped_zero: int = 0  # groups not searched: a lower ZeRO stage fits their configuration
    skipped_memory: int = 0  # groups not searched: no split of any depth fits in memory
    skipped_bound: int = 0  # groups not searched: their lower bound cannot enter the K best
    depths: int = 0  # (group, depth) pairs considered
    pruned_bound: int = 0  # depths dominated by the K best before their step end was costed
    unrefined: int = 0  # finalists ranked on the search's split, past the refinement's bound (planner.REFINED_CELLS)

    @property
    def enumerated(self) -> int:
        """Groups of the space (a configuration with a ZeRO stage and a replica count): searched or skipped."""
        return self.groups + self.skipped_zero + self.skipped_memory + self.skipped_bound
