"""What every chart of the workbench shares: the template, the model colours, units and number formats."""

from __future__ import annotations

TEMPLATE = "plotly_white"
COLORS = {"teacher": "#1f77b4", "student": "#d62728"}  # also the order models are drawn in
BENCH_COLORS = {**COLORS, "floor": "#7f7f7f"}  # benchmarks also draw the attention-free floor
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]  # one per group of fixed factors
GIB = 1024**3
MEMORY_UNIT = "GiB"  # the one unit of benchmark memory, in charts and tables: bytes / GIB
RATIO_FORMAT = ".3f"  # ratios near 1 (student / teacher), as common.fmt_ratio: 1.0012 reads 1.001, never 1
