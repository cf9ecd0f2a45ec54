"""Entry point of the workbench UI: ``streamlit run app/streamlit_app.py`` (``lolcats app`` does it).

Routes only: every page is a script in ``app/views/``, listed in ``app/navigation.py``.
"""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:  # `streamlit run` puts app/ on the path, not the project root
    sys.path.insert(0, ROOT)

import streamlit as st  # noqa: E402

from app.navigation import PAGES, sections  # noqa: E402

# an emoji icon is drawn in the browser (a data: URL); a Material one would be fetched from a font server
st.set_page_config(page_title="LoLCATs Workbench", page_icon="🧪", layout="wide")

menu = {
    section: [st.Page(p.script, title=p.title, icon=p.icon, default=p is PAGES[0]) for p in pages]
    for section, pages in sections().items()
}
st.navigation(menu).run()
