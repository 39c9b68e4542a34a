"""The tt-lang emitter's code for the online rewrite (`synth.ir.online`): one step of a
running maximum and the rescale of the sums over it, in the compute function.

The running maximum X is an accumulator (`X_acc`, two blocks: loaded or filled with
-inf before the pass loop, updated every step). At a step, in order:

    with X_acc.wait() as X_prev:                     # the maximum before this step
        with X_cur.reserve() as cur:                 # the new one, for this step's readers
            cur.store(max(X_prev, reduce_max(s)))
        with X_cur.wait() as X:
            with X_acc.reserve() as acc:             # and for the next step
                acc.store(X)
            with X_scale.reserve() as f:             # exp(c * (X - X_prev)), per row
                f.store(ttl.math.exp(X_prev - X))
            with X_scale.wait() as f:
                with l_acc.wait() as pre, l_acc.reserve() as acc:   # each rescaled sum
                    acc.store(pre * ttl.block.broadcast(f, dims=[1], shape=...))
            ... the rest of the step (p = exp(s - X), l += ..., o += p @ V) reads X

`X_cur` and `X_scale` are the two dataflow buffers the rewrite adds
(`synth.ir.dataflow.kernel_buffers`: the previous tile of the IR is the block waited
from `X_acc`, with no buffer of its own). At the first step X_prev is -inf and the
factor exp(-inf) = 0: the sums start from their fills. Rows are never all padding
(`ttlang.check_padding` refuses reductions over padded tensors), so the factor is never
exp(-inf + inf).

With one step (the pass's keys all in one block: no loop over them, so X is no
accumulator) the step is the plain reductions: X = max(-inf, reduce_max(s)) read by the
rest of the step, and the rescales are dropped (their factor exp(-inf - X) = 0 would
multiply the sums' fills, 0). `X_cur` and `X_scale` are still declared, as the model
counts them. The solver picks this case where the matrix engine makes the fused kernel
cheap at small sizes (attention at S = 64 on wormhole).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synth.ir.nodes import Compute, Node, Rescale, Running

if TYPE_CHECKING:
    from synth.emit.ttlang import Ctx


def online_step(ctx: Ctx, node: Running, rest: tuple[Node, ...], depth: int,
                opened: frozenset[str]) -> list[str]:
    """The lines of the step that starts at `node` and the rest of its body."""
    from synth.emit.ttlang import INDENT, EmitError, _compute, literal, node_expression
    pad = INDENT * depth
    running, previous = node.running, node.previous
    at = next((k for k, n in enumerate(rest) if isinstance(n, Compute)
               and n.statement == node.statement and n.out == running), None)
    if at is not None and running not in ctx.accumulators and not any(
            isinstance(n, Rescale) and n.target in ctx.accumulators for n in rest):
        return _compute(ctx, tuple(n for n in rest if not isinstance(n, Rescale)), depth,
                        opened)  # one step: the plain reductions (see the module's doc)
    if at is None or running not in ctx.accumulators:
        raise EmitError(f"--emit ttlang: the running maximum {running} of kernel "
                        f"{ctx.kernel.name} is not updated as an accumulator here; the "
                        "online step is not emitted")
    compute = rest[at]
    assert isinstance(compute, Compute)
    before = [n for n in rest[:at] if isinstance(n, Compute)]
    if before:
        raise EmitError(f"--emit ttlang: kernel {ctx.kernel.name} computes "
                        f"{before[0].out} between the running maximum's save and update")
    scales = []
    after = at + 1
    while after < len(rest) and isinstance(rest[after], Rescale):
        scale = rest[after]
        assert isinstance(scale, Rescale)
        if scale.target not in ctx.accumulators:
            raise EmitError(f"--emit ttlang: rescale of {scale.target} in kernel "
                            f"{ctx.kernel.name}: not an accumulator across the pass")
        scales.append(scale)
        after += 1
    stmt, expr = node_expression(ctx, compute)
    combine = {"max=": "ttl.math.max({}, {})", "min=": "ttl.math.min({}, {})"}.get(stmt.op.value)
    if combine is None:
        raise EmitError(f"--emit ttlang: the running statistic {running} is a "
                        f"{stmt.op.value} reduction; the online step takes max= or min=")
    i1, i2, i3 = (pad + INDENT * k for k in (1, 2, 3))
    lines = [f"{pad}with {running}_acc_dfb.wait() as {previous}:",
             f"{i1}with {running}_cur_dfb.reserve() as cur:",
             f"{i2}cur.store({combine.format(previous, expr)})",
             f"{i1}with {running}_cur_dfb.wait() as {running}:",
             f"{i2}with {running}_acc_dfb.reserve() as acc:",
             f"{i3}acc.store({running})"]
    if scales:
        coeffs = {s.coeff for s in scales}
        if len(coeffs) != 1:
            raise EmitError(f"--emit ttlang: kernel {ctx.kernel.name} rescales by "
                            f"several coefficients {sorted(coeffs)}; one factor is emitted")
        [coeff] = coeffs
        shape = _shape(ctx, running)
        moved = f"({running} - {previous})"
        factor = (f"({previous} - {running})" if coeff == -1 else moved if coeff == 1 else
                  f"({moved} * ttl.block.fill({literal(coeff)}, shape={shape}))")
        lines += [f"{i2}with {running}_scale_dfb.reserve() as scale:",
                  f"{i3}scale.store(ttl.math.exp({factor}))",
                  f"{i2}with {running}_scale_dfb.wait() as scale:"]
        for s in scales:
            lines += [f"{i3}with {s.target}_acc_dfb.wait() as pre, "
                      f"{s.target}_acc_dfb.reserve() as acc:",
                      f"{i3}{INDENT}acc.store(pre * ttl.block.broadcast(scale, dims=[1], "
                      f"shape={_shape(ctx, s.target)}))"]
    body = _compute(ctx, rest[after:], depth + 2, opened | {running, previous})
    return lines + body


def _shape(ctx: Ctx, buffer: str) -> tuple[int, int]:
    from synth.emit.ttlang import _shape as shape
    return shape(ctx, buffer)
