"""The NumPy interpreter's handlers for the online rewrite's nodes (`synth.ir.online`).

A loop whose body holds them runs step by step (`fold_plan` never batches it): each step
of a running maximum depends on the one before. The factor exp(c (m - m_prev)) is 1
where the maximum did not move (also where both are -inf: a row that has seen only
padding), and a sum that is still 0 while the previous maximum was -inf stays 0.
"""

from __future__ import annotations

import numpy as np

from synth.errors import IRError
from synth.ir.interpret import BufferState, Machine, handles
from synth.ir.nodes import Rescale, Running


@handles(Running)
def run_running(m: Machine, node: Running) -> None:
    running, previous = m.buffers[node.running], m.buffers[node.previous]
    if running.values.shape != previous.values.shape:
        raise IRError(f"running {node.running}: expected {node.previous} of shape "
                      f"{running.values.shape}, got {previous.values.shape}")
    previous.values = running.values.copy()
    previous.init = running.init.copy()
    previous.complete = running.complete


@handles(Rescale)
def run_rescale(m: Machine, node: Rescale) -> None:
    target = m.buffers[node.target]
    running, previous = m.buffers[node.running], m.buffers[node.previous]
    if target.instance_loops != running.instance_loops:
        raise IRError(f"rescale {node.target}: expected the units of {node.running}, got "
                      f"{target.instance_loops} and {running.instance_loops}")
    with np.errstate(all="ignore"):
        moved = running.values != previous.values
        factor = np.where(moved, np.exp(node.coeff * (running.values.astype(np.float64)
                                                       - previous.values)), 1.0)
        factor = _along(factor, running, target)
        scaled = (target.values * factor).astype(target.values.dtype)
    target.values = np.where(target.init, scaled, target.values)


def _along(factor: np.ndarray, running: BufferState, target: BufferState) -> np.ndarray:
    """The factor per row laid out along the target's axes (1 along its other dims)."""
    lead = len(running.instance_loops)
    rows = list(running.decl.dims)
    order = [d for d in target.decl.dims if d in rows]
    factor = np.moveaxis(factor, [lead + rows.index(d) for d in order],
                         list(range(lead, lead + len(order))))
    shape = list(factor.shape[:lead])
    for dim in target.decl.dims:
        shape.append(running.decl.shape[rows.index(dim)] if dim in rows else 1)
    return factor.reshape(shape)
