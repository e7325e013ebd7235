"""Tables (rich) and plots (matplotlib, imported lazily) of run summaries."""
from tierserve.report.tables import DEFAULT_COMPARISON_METRICS, render_comparison, render_summary

__all__ = ["DEFAULT_COMPARISON_METRICS", "render_comparison", "render_summary"]
