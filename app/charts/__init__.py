"""Plotly figures of the workbench, one module a subject (pure functions of plain data; no Streamlit, no torch)."""
