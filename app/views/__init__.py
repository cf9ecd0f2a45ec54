"""Workbench pages: each module is a Streamlit page script routed by app/streamlit_app.py."""
