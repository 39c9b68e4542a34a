"""The NumPy interpreter's handler of `OnlineCombine` (`synth.ir.nodes`): the partial
running statistics of units that split an online kernel's pass, merged.

With m = max(running, max_k m_k), each sum becomes
target * exp(c (m - running)) + sum_k s_k * exp(c (m - m_k)), computed in float64 and
cast to the sum's dtype. A factor is 1 where its maximum is m, also where both are -inf
(a unit that has seen only padding: its sums are 0); c (m - m_k) is never positive for
the coefficients the rewrite derives (c < 0), so no factor overflows however large the
scores are.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from synth.errors import IRError
from synth.ir.interpret import Machine, handles
from synth.ir.nodes import BufferDecl, OnlineCombine
from synth.ir.online import merge_dims

Array = np.ndarray


@handles(OnlineCombine)
def run_online_combine(m: Machine, node: OnlineCombine) -> None:
    running, parts = m.buffers[node.running], m.buffers[node.partials]
    lead = len(parts.instance_loops)
    axes = tuple(range(lead, lead + len(parts.decl.partial_loops)))
    valid = running.init
    if not valid.any() or not np.all(parts.init.all(axis=axes) | ~valid):
        raise IRError(f"online combine {node.partials}: expected initialised partials and "
                      f"target")
    with np.errstate(all="ignore"):
        old = running.values.astype(np.float64)
        each = parts.values.astype(np.float64)
        new = np.maximum(old, np.max(each, axis=axes))
        for merged in node.sums:
            target, partials = m.buffers[merged.target], m.buffers[merged.partials]
            if target.instance_loops != running.instance_loops:
                raise IRError(f"online combine {node.partials}: expected {merged.target} "
                              f"on the units of {node.running}, got {target.instance_loops} "
                              f"and {running.instance_loops}")
            rows = dataclasses.replace(running.decl, dims=merge_dims(running.decl, parts.decl))
            into = dataclasses.replace(target.decl, dims=merge_dims(target.decl,
                                                                    partials.decl))
            mine = along(factor(old, new, merged.coeff), rows, len(running.instance_loops),
                         into)
            theirs = along(factor(each, np.expand_dims(new, axes), merged.coeff), parts.decl,
                           lead + len(axes), partials.decl)
            summed = np.sum(partials.values * theirs, axis=axes)
            order = [partials.decl.dims.index(d) for d in into.dims]
            summed = np.transpose(summed, [*range(lead), *(lead + k for k in order)])
            value = target.values * mine + summed
            target.values = np.where(target.init, value.astype(target.values.dtype),
                                     target.values)
    running.values = np.where(valid, new.astype(running.values.dtype), running.values)


def factor(maximum: Array, new: Array, coeff: float) -> Array:
    """exp(c (new - maximum)), 1 where the maximum is the new one."""
    return np.where(maximum == new, 1.0, np.exp(coeff * (new - maximum)))


def along(values: Array, rows: BufferDecl, lead: int, target: BufferDecl) -> Array:
    """`values` (`lead` leading axes, then the axes of the tile `rows`) laid out along
    `target`'s axes: its row axes in the target's order, 1 along its other dims."""
    dims = list(rows.dims)
    order = [d for d in target.dims if d in dims]
    values = np.moveaxis(values, [lead + dims.index(d) for d in order],
                         list(range(lead, lead + len(order))))
    shape = list(values.shape[:lead])
    for dim in target.dims:
        shape.append(rows.shape[dims.index(dim)] if dim in dims else 1)
    return values.reshape(shape)
