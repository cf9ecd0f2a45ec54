"""Entry point of the workbench UI: ``streamlit run app/streamlit_app.py`` (``lolcats app`` does it).

Routes only: every page is a script in ``app/views/``.
"""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:  # `streamlit run` puts app/ on the path, not the project root
    sys.path.insert(0, ROOT)

import streamlit as st  # noqa: E402

st.set_page_config(page_title="LoLCATs Workbench", page_icon=":material/science:", layout="wide")

pages = {
    "Convert": [
        st.Page("views/launch.py", title="Launch", icon=":material/rocket_launch:", default=True),
        st.Page("views/jobs.py", title="Jobs", icon=":material/list:"),
        st.Page("views/layers.py", title="Layers", icon=":material/stacked_line_chart:"),
        st.Page("views/evaluation.py", title="Evaluation", icon=":material/fact_check:"),
        st.Page("views/budgets.py", title="Budgets", icon=":material/tune:"),
    ],
    "Inspect": [
        st.Page("views/attention.py", title="Attention", icon=":material/grid_on:"),
        st.Page("views/chat.py", title="Chat", icon=":material/forum:"),
        st.Page("views/throughput.py", title="Throughput", icon=":material/speed:"),
    ],
}
st.navigation(pages).run()
