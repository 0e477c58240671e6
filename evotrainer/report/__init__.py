"""The run report: one self-contained `report.html` per run directory."""

from evotrainer.report.html import render_report

__all__ = ["render_report"]
