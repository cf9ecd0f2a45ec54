"""Hybrid (sliding-window / terraced / linear) attention as one op, in PyTorch and Triton forms.

``window`` (the kinds and the window rule), ``naive`` (the quadratic reference), ``chunk_torch`` and
``chunk_triton`` (the parallel form), ``recurrent_torch`` and ``recurrent_triton`` (the recurrent
state and the decode step), ``ring`` (the decode window cache); ``kernels.dispatch`` picks a backend
(docs/kernels.md). Importing the package loads nothing heavy; import the submodule you need.
"""
