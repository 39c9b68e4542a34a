"""The online-softmax rewrite (FlashAttention's), derived from the algebra of the chain.

A reduction `m max= f` over a dimension j is complete only after the whole pass over j,
so a statement that consumes m while iterating j (`p = exp(s - m)`) cannot share that
pass, unless everything downstream in the pass can be corrected when the running
maximum grows. It can when m reaches the pass only through exponentials of terms
*affine* in m with a constant coefficient c (`exp((s - m) * 0.125)`: c = -0.125):

    exp(a + c m_old) = exp(a + c m_new) * exp(c (m_old - m_new))

so a value built from such terms by products with values that do not depend on m
(`p * V`), quotients by them, and sums of terms with the same coefficient carries the
factor exp(c m) (it is *scaled* by c). A running *sum* over j of scaled terms
(`l += p`, `o += p * V`) is then corrected by multiplying it by exp(c (m_new - m_old))
each time the running maximum moves from m_old to m_new (the *rescale*); after the
pass, the sums are exact. The rewrite is legal for a group of statements when:

- one statement reduces `max=` over exactly one dimension j, and some statement of the
  group consumes its target while iterating j (else the group is an ordinary one);
- every statement of the group that iterates j (the *pass*) iterates the rows of m
  (m's indices) too; their other dimensions (the *inner* ones, such as attention's head
  dimension) are whole in every compute tile (the `online` constraints);
- inside the pass, m is consumed only through scaled values; a scaled element-wise value
  is consumed only inside the kernel (its values use the running maximum); a reduction
  of scaled values is a sum over j;
- the statements that do not iterate j are element-wise and come after the pass (the
  final normalisation, `O = o / l`, reads the exact values).

Softmax over one vector has no such group (its exponentials `e` are read after the pass
by `y = e / s`), nor has a max consumed by anything but an exponential.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from synth.vectors import contraction
from synth.workload import Access, BinOp, Call, Expr, Neg, Num, ReduceOp, SizeRef, Statement
from synth.workload import walk as expr_nodes

ONLINE_PREFIX = "online."


def online_decision(kernel: str) -> str:
    """The one naming rule for online decisions: `online.s_m_p_l_o` is 1 when that
    kernel runs with the online rewrite (its only way to run)."""
    return f"{ONLINE_PREFIX}{kernel}"


@dataclass(frozen=True)
class OnlinePlan:
    """How a group runs online: its running maximum and what the rescale corrects."""

    statement: str  # the max reduction (the running statistic)
    target: str  # its tensor
    dim: str  # the dimension of the pass (the one it reduces)
    rows: tuple[str, ...]  # its indices
    inner: tuple[str, ...]  # other dims of the pass, whole in every compute tile
    rescaled: Mapping[str, float]  # sum target -> c: corrected by exp(c (m_new - m_old))


class _Illegal(Exception):
    pass


def is_candidate(stmts: Sequence[Statement]) -> bool:
    """Whether the group has a max reduction consumed inside its own pass (so it can run
    only with the rewrite)."""
    return _running_max(stmts) is not None


def _running_max(stmts: Sequence[Statement]) -> Statement | None:
    for pos, stmt in enumerate(stmts):
        if stmt.op is ReduceOp.MAX and stmt.reduced and any(
                stmt.target in s.inputs and set(stmt.reduced) & set(s.dims)
                for s in stmts[pos + 1:]):
            return stmt
    return None


def plan(stmts: Sequence[Statement], leaves: Mapping[str, bool]) -> OnlinePlan | str:
    """The plan of an online candidate group (`is_candidate`), or why it is illegal.
    `leaves[t]`: tensor t written by the group is read outside it (or is an output)."""
    try:
        return _plan(stmts, leaves)
    except _Illegal as why:
        return str(why)


def _plan(stmts: Sequence[Statement], leaves: Mapping[str, bool]) -> OnlinePlan:
    running = _running_max(stmts)
    assert running is not None
    if len(running.reduced) != 1 or running.accumulates:
        raise _Illegal(f"{running.name} reduces over {', '.join(running.reduced)}; the "
                       f"online rewrite runs a maximum over one dimension, assigned once")
    dim, rows = running.reduced[0], running.indices
    pass_stmts = [s for s in stmts if dim in s.dims]
    last = stmts.index(pass_stmts[-1])
    inner: list[str] = []
    for stmt in pass_stmts:
        if not set(rows) <= set(stmt.dims):
            raise _Illegal(f"{stmt.name} iterates {dim} but not every row index "
                           f"({', '.join(rows)}) of the running maximum {running.name}")
        inner.extend(d for d in stmt.dims if d not in rows and d != dim and d not in inner)
    for pos, stmt in enumerate(stmts):
        if dim not in stmt.dims and (pos < last or stmt.op.reduces or stmt.accumulates):
            raise _Illegal(f"{stmt.name} does not iterate {dim}: only element-wise "
                           f"statements after the pass over {dim} may join it")
    rescaled = _scaled(stmts[stmts.index(running) + 1:], running, dim, leaves)
    return OnlinePlan(running.name, running.target, dim, rows, tuple(inner), rescaled)


def _scaled(after: Sequence[Statement], running: Statement, dim: str,
            leaves: Mapping[str, bool]) -> dict[str, float]:
    """The sums to rescale, checking every statement after the running max."""
    scaled: dict[str, float] = {}  # element-wise pass values carrying exp(c m)
    rescaled: dict[str, float] = {}
    for stmt in after:
        if dim not in stmt.dims:
            continue  # after the pass: reads exact values
        if stmt.target in scaled or stmt.target in rescaled:
            raise _Illegal(f"{stmt.name} writes {stmt.target} again inside the pass")
        coeff = _scale(stmt.expr, running.target, scaled, stmt.name)
        if coeff is None:
            continue
        if not stmt.op.reduces:
            if leaves.get(stmt.target, False):
                raise _Illegal(f"{stmt.name} computes {stmt.target} against the running "
                               f"maximum {running.target}, but {stmt.target} is read "
                               f"outside the group: only the final sums are exact")
            scaled[stmt.target] = coeff
        elif stmt.op is not ReduceOp.ADD or dim not in stmt.reduced or stmt.accumulates:
            raise _Illegal(f"{stmt.name} {stmt.op.value}-reduces exponentials of the "
                           f"running maximum {running.target}; only a sum over {dim} "
                           f"can be rescaled when the maximum grows")
        else:
            rescaled[stmt.target] = coeff
    return rescaled


def _scale(expr: Expr, m: str, scaled: Mapping[str, float], name: str) -> float | None:
    """c when `expr` carries the factor exp(c m); None when it does not depend on m."""
    if not any(isinstance(n, Access) and (n.tensor == m or n.tensor in scaled)
               for n in expr_nodes(expr)):
        return None
    if isinstance(expr, Access):
        if expr.tensor == m:
            raise _Illegal(f"{name} consumes the running maximum {m} outside an "
                           f"exponential, which no rescale can correct")
        return scaled[expr.tensor]
    if isinstance(expr, Call) and expr.fn == "exp":
        if any(isinstance(n, Access) and n.tensor in scaled for n in expr_nodes(expr)):
            raise _Illegal(f"{name} takes exp of a value already scaled by the running "
                           f"maximum {m}")
        coeff = _linear(expr.args[0], m, name)
        return coeff or None
    if isinstance(expr, Neg):
        return _scale(expr.arg, m, scaled, name)
    if isinstance(expr, BinOp):
        left, right = (_scale(e, m, scaled, name) for e in (expr.lhs, expr.rhs))
        if expr.op == "*":
            return (left or 0.0) + (right or 0.0)
        if expr.op == "/" and right is None:
            return left
        if expr.op in "+-" and left is not None and left == right:
            return left
    raise _Illegal(f"{name} combines exponentials of the running maximum {m} in a way "
                   f"a rescale cannot correct (only products, quotients by other values "
                   f"and sums of like terms can)")


def _linear(expr: Expr, m: str, name: str) -> float:
    """The coefficient c of m in `expr` = a + c m (a not depending on m)."""
    if isinstance(expr, Access):
        return 1.0 if expr.tensor == m else 0.0
    if isinstance(expr, Num | SizeRef):
        return 0.0
    if isinstance(expr, Neg):
        return -_linear(expr.arg, m, name)
    if isinstance(expr, BinOp):
        left, right = _linear(expr.lhs, m, name), _linear(expr.rhs, m, name)
        if expr.op == "+":
            return left + right
        if expr.op == "-":
            return left - right
        if not left and not right:
            return 0.0
        if expr.op == "*" and not right:
            constant = _constant(expr.rhs)
            if constant is not None:
                return left * constant
        elif expr.op == "*" and not left:
            constant = _constant(expr.lhs)
            if constant is not None:
                return right * constant
        elif expr.op == "/" and not right:
            constant = _constant(expr.rhs)
            if constant:
                return left / constant
    elif not any(isinstance(n, Access) and n.tensor == m for n in expr_nodes(expr)):
        return 0.0
    raise _Illegal(f"{name} takes exp of a term that is not affine in the running maximum "
                   f"{m}, so exp(c (m_new - m_old)) cannot correct it")


def _constant(expr: Expr) -> float | None:
    """The value of an expression of literals and sizes (None when it reads a tensor)."""
    if isinstance(expr, Num):
        return float(expr.value)
    if isinstance(expr, SizeRef):
        return float(expr.value)
    if isinstance(expr, Neg):
        value = _constant(expr.arg)
        return None if value is None else -value
    if isinstance(expr, BinOp):
        lhs, rhs = _constant(expr.lhs), _constant(expr.rhs)
        if lhs is None or rhs is None:
            return None
        if expr.op == "/":  # C semantics: integer literals divide as integers
            integers = all(isinstance(e, SizeRef) or (isinstance(e, Num) and isinstance(
                e.value, int)) for e in (expr.lhs, expr.rhs))
            return None if not rhs or integers else lhs / rhs
        return {"+": lhs + rhs, "-": lhs - rhs, "*": lhs * rhs}[expr.op]
    return None


def step_vector(stmt: Statement, kernel_vector: str | None, vectorisable: bool) -> str | None:
    """The dimension a statement of an online kernel's step runs in vectors along, where
    the kernel's vector dimension (`synth.vectors.vector_dim`, attention's e) does not
    reach it: the scores, the maximum, the exponentials and the row sum of attention
    run along j or d instead of one element at a time. The step's tiles without the
    kernel's vector dimension are plain row-major arrays, so a dimension qualifies when
    every access that has it has it last (contiguous), the target's too: the target's
    last index first (`p[i, j] = exp(s[i, j] - m[i])`: j), else a reduced one (a dot
    product, `s[i, j] += Q[i, d] * K[j, d]`: d; a row reduction, `m[i] max= s[i, j]`:
    j). None when the kernel's vector dimension reaches it (the C emitter's own vector
    code runs it) or no dimension qualifies (scalar code). Shared by the cost model
    (`online_terms`) and the C emitter (`emit.c_online`)."""
    if not vectorisable or (kernel_vector is not None and kernel_vector in stmt.dims):
        return None
    accesses = [n for n in expr_nodes(stmt.expr) if isinstance(n, Access)]

    def contiguous(dim: str) -> bool:
        return all(a.indices[-1] == dim for a in accesses if dim in a.indices) and (
            dim not in stmt.indices or stmt.indices[-1] == dim) and any(
            dim in a.indices for a in accesses)

    if transposed_operand(stmt) is not None:
        return stmt.indices[-1]
    options = [*stmt.indices[-1:], *stmt.reduced]
    return next((d for d in options if contiguous(d)), None)


def transposed_operand(stmt: Statement) -> Access | None:
    """The operand a step's contraction reads transposed: in `s[i, j] += Q[i, d] *
    K[j, d]`, K (the target's last index j is K's, but not its last, and not Q's). The
    C emitter copies its tile with j last once per step, so the contraction runs as
    an outer product in vectors along j with register accumulators (no fold per
    element), as a GEMM micro-kernel does."""
    found = contraction(stmt)
    if found is None or not stmt.indices:
        return None
    last = stmt.indices[-1]
    having = [a for a in found if last in a.indices]
    if len(having) != 1 or having[0].indices[-1] == last or len(set(having[0].indices)) \
            != len(having[0].indices) or (len(stmt.indices) > 1
                                          and stmt.indices[-2] in having[0].indices):
        return None  # (its tile is loaded once for every row of the block)
    return having[0]
