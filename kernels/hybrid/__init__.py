"""Hybrid (sliding-window / terraced / linear) attention: PyTorch and Triton forms of one op.

Importing the package loads nothing heavy; import the submodule you need.
"""
