"""Attention workbench: attention-guided context pruning and KV-cache eviction, exact and fast.

Data flows one way: run (``models``, ``prompt``) → capture (``capture``) → analyse (pure
functions of a ``Capture``) → show (plots, widgets, export).
"""
__version__ = "0.1.0"
