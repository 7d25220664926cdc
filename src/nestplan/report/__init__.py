"""Presentation of plans: readable text, plots, comparison tables (the plan JSON itself: ``nestplan.plan``)."""
