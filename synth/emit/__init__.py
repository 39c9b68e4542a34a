"""Code emitters, one per target, sharing one C-style renderer (see docs/architecture.md).

Empty so far: the UPMEM and MLIR emitters are the next pieces of work (issues 3 and 5).
"""
