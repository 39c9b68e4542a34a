"""What runs in vector instructions on a CPU: shared by the C emitter, which writes the
vector code, and the cost model, which prices it (`synth.constraints.roofline`), so the
two agree on which statements are vectorised and along which dimension."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from synth.hardware import Hardware
from synth.workload import Access, BinOp, Call, DType, ReduceOp, Statement
from synth.workload import walk as expr_nodes

# the dtypes with vector arithmetic in synth_vec.h, and the functions it has for each
VECTOR_FUNCTIONS: Mapping[DType, frozenset[str]] = {
    DType.F32: frozenset(("exp", "log", "sqrt", "rsqrt", "recip", "tanh", "abs", "relu",
                          "max", "min")),
    DType.I32: frozenset(("abs", "relu", "max", "min")),
}


def vectorisable(stmt: Statement, dtypes: Mapping[str, DType]) -> bool:
    """Whether a statement's arithmetic has a vector form in synth_vec.h: one dtype with
    vector types throughout (no mixed integer and float parts) and functions that
    synth_vec.h provides for it. The others run one element per instruction."""
    if stmt.dtype not in VECTOR_FUNCTIONS:
        return False
    for node in expr_nodes(stmt.expr):
        if isinstance(node, Access) and dtypes[node.tensor] is not stmt.dtype:
            return False
        if isinstance(node, Call) and node.fn not in VECTOR_FUNCTIONS[stmt.dtype]:
            return False
    return True


def vector_dim(statements: Sequence[Statement]) -> str | None:
    """The dimension a kernel's innermost tiles are vectors along: the last index of its
    last statement's target (contiguous in memory), or, for a reduction into a scalar,
    the last index of its first operand that has one."""
    stmt = statements[-1]
    if stmt.indices:
        return stmt.indices[-1]
    operands = [n.indices for n in expr_nodes(stmt.expr) if isinstance(n, Access) and n.indices]
    return operands[0][-1] if operands else None


def vector_options(statements: Sequence[Statement]) -> tuple[str, ...]:
    """The dimensions a kernel of `statements` may run its register tiles as vectors
    along: `vector_dim` first, then, for a reduction into an indexed target that is not
    a contraction (a row sum `sm[s] += x[s, d]`), the reduced dimension its operand is
    contiguous along (the last index of its first operand). Along the target's own last
    index every vector of the operand is gathered from as many rows as lanes; along the
    reduced one it is a plain load, and each row's vector accumulators fold once at the
    end of the row (`cpu_compute.fold_cost`). Which is faster depends on the tiles (a
    short row folds often), so both are candidates and the solver decides
    (`KernelSpec.vector`). A contraction's operands are packed for a register-blocked
    micro-kernel instead (`contraction`)."""
    default = vector_dim(statements)
    options = [default] if default is not None else []
    for stmt in statements:
        if not stmt.reduced or not stmt.indices or contraction(stmt) is not None:
            continue
        operands = [n.indices for n in expr_nodes(stmt.expr)
                    if isinstance(n, Access) and n.indices]
        if operands and operands[0][-1] in stmt.reduced and operands[0][-1] not in options:
            options.append(operands[0][-1])
    return tuple(options)


def contraction(stmt: Statement) -> tuple[Access, Access] | None:
    """The two operands of `T[..] += X[..] * Y[..]` (distinct tensors), else None: the
    statements the C emitter runs as a micro-kernel over packed operands."""
    expr = stmt.expr
    if (stmt.op is not ReduceOp.ADD or not stmt.reduced or not isinstance(expr, BinOp)
            or expr.op != "*" or not isinstance(expr.lhs, Access)
            or not isinstance(expr.rhs, Access) or expr.lhs.tensor == expr.rhs.tensor):
        return None
    return expr.lhs, expr.rhs


def pack_memory(hw: Hardware) -> str | None:
    """The units' private cache where contraction operands are packed: the outermost
    memory of the level below the root, neither the root nor the registers (`cpu`: each
    core's L2)."""
    if len(hw.levels) < 2:
        return None
    level = hw.levels[1].name
    for mem in hw.memories[1:-1]:
        if mem.level == level:
            return mem.name
    return None


def packable_operand(stmt: Statement, access: Access) -> bool:
    """An operand the emitter packs: indexed by distinct dims, some shared with the
    target (its panels' blocks) and some reduced (what the micro-kernel walks), no other,
    and not by every dimension of the target: its elements are then reused across the
    target's others (a matrix-vector product's matrix is read once, and packing it
    only copies it: mv ran 1.7x slower packed)."""
    dims = access.indices
    free = [d for d in dims if d in stmt.indices]
    reduced = [d for d in dims if d in stmt.reduced]
    return (len(set(dims)) == len(dims) and bool(free) and bool(reduced)
            and len(free) + len(reduced) == len(dims)
            and any(d not in dims for d in stmt.indices))
