"""Presentation of plans: JSON (schema nestplan.plan/1) and readable text."""
