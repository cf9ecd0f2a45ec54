"""What a converted model carries when it leaves the workbench (``lolcats export``).

``teacher``: the base model an export names, swapped in for teacher comparisons; ``modeling``: the
self-contained modeling file that lets plain transformers load an export; ``card``: its model card.
``folder``: the writer (:func:`core.export.folder.export`) and the Hub upload. Import the submodule you need.
"""
