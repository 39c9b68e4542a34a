"""The MLIR emitter: a solved loop nest as upstream MLIR, in three files.

`emit_mlir(program, workload, hw, out_dir, inputs, expected)` writes into `out_dir`:

- `schedule.mlir`: the loop nest itself, on memrefs. Each kernel is a function; parallel
  loops are `scf.forall` and sequential ones `scf.for`, tagged with the hardware level or
  memory they belong to (`{synth.level = "dpu"}`: the upstream `mapping` attribute only
  takes GPU-style device mappings). Every buffer is a `memref.alloc` in the memory space
  of its memory (the root memory is the default space, the next memories 1, 2, ... in the
  order of the hardware model), tiles are `memref.subview`s, loads and stores
  `linalg.copy`, fills `linalg.fill` and computes `linalg.generic` with `arith`/`math`
  bodies. Shapes are static wherever a tile lies inside its tensor; a ragged tile at the
  edge is an `affine.min`-sized view, which is how MLIR says what the interpreter masks.
  Partial results of a split reduction live in a buffer with a leading axis per partial
  loop, and `Combine` folds them with a reduction `linalg.generic`.
- `source.mlir`: the workload as untiled linalg on tensors, one op per statement (tagged
  `{synth.statement = NAME}`), in a function taking the inputs and returning the outputs.
- `transform.mlir`: a transform-dialect script that applies the same schedule to
  `source.mlir` (`synth.emit.mlir_transform`); bufferization is left to the consumer.
- `check/`: the validation inputs and the reference outputs, on which
  `synth.emit.mlir_check` runs both programs with upstream MLIR.

Arithmetic follows the reference (`synth.reference`), as the C emitters do: integers in
32 bits with wrap-around, integer `/` truncating with 0 for a zero divisor, floats in
`f32` for float statements (`f64` for the float parts of integer statements), math
functions always in floating point, results converted to the target's type like C does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from synth.emit import mlir_online
from synth.emit.cstyle import Code, EmitError, statement_text
from synth.emit.mlir_check import write_check_data
from synth.hardware import Hardware
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Node,
    Program,
    Rescale,
    Running,
    Store,
    walk,
)
from synth.reference import evaluate_errors
from synth.workload import (
    Access,
    BinOp,
    Call,
    DType,
    Expr,
    Neg,
    Num,
    ReduceOp,
    Role,
    SizeRef,
    Statement,
    Workload,
    accesses,
)

__all__ = ["FILES", "MlirEmission", "emit_mlir", "entry_name", "schedule_text", "source_text"]

FILES = ("schedule.mlir", "source.mlir", "transform.mlir")
ELEMENT_TYPES = {DType.F32: "f32", DType.F16: "f16", DType.I32: "i32", DType.I16: "i16",
                 DType.I8: "i8"}
INDENT = "  "


@dataclass(frozen=True)
class MlirEmission:
    out_dir: Path
    files: tuple[Path, ...]  # the MLIR files, then the check's data
    entry: str  # the function schedule.mlir and source.mlir both define: @<entry>


def emit_mlir(program: Program, workload: Workload, hw: Hardware, out_dir: str | Path,
              inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
              bounds: Mapping[str, np.ndarray] | None = None) -> MlirEmission:
    """Write schedule.mlir, source.mlir and transform.mlir into `out_dir` (created if
    needed), and the data `synth.emit.mlir_check` runs them on. Raises EmitError for a
    loop nest this emitter cannot express."""
    from synth.emit.mlir_transform import transform_text  # its own module (it uses ours)
    texts = {"schedule.mlir": schedule_text(program, workload, hw),
             "source.mlir": source_text(workload),
             "transform.mlir": transform_text(program, workload, hw)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (out / name).write_text(text)
    if bounds is None:  # the outputs' error scales, for the check's tolerances
        bounds = evaluate_errors(workload, inputs)[1]
    data = write_check_data(out, workload, entry_name(workload), inputs, expected, bounds)
    return MlirEmission(out, tuple(out / name for name in FILES) + tuple(data),
                        entry_name(workload))


def entry_name(workload: Workload) -> str:
    return ssa_id(workload.name)


# ---------------------------------------------------------------- names and types


def ssa_id(text: str) -> str:
    """`text` as an MLIR identifier (SSA value, symbol or affine dim): other characters
    become `_` (`C#1` -> `C_1`)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return name if name and not name[0].isdigit() else f"v{name}"


AFFINE_KEYWORDS = frozenset(("ceildiv", "floordiv", "mod", "symbol", "max", "min"))


def dim_id(text: str) -> str:
    """A dimension name usable inside `affine_map<(i, j) -> ...>`."""
    name = ssa_id(text)
    return name + "_" if name in AFFINE_KEYWORDS else name


class SsaNames:
    """Unique names in one scope (SSA values of a function, `%name`; or symbols of a
    module, with `sigil=""`): each wanted name, suffixed where taken."""

    def __init__(self, sigil: str = "%") -> None:
        self.taken: set[str] = set()
        self.sigil = sigil

    def __call__(self, wanted: str) -> str:
        base = ssa_id(wanted)
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}_{n}", n + 1
        self.taken.add(name)
        return f"{self.sigil}{name}"


def element_type(dtype: DType) -> str:
    if dtype not in ELEMENT_TYPES:
        supported = ", ".join(d.value for d in ELEMENT_TYPES)
        raise EmitError(f"the MLIR emitter cannot emit {dtype.value} tensors yet "
                        f"(supported: {supported})")
    return ELEMENT_TYPES[dtype]


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


@dataclass(frozen=True)
class MemRef:
    """A memref type: static sizes (None: a ragged, dynamic one), and either the identity
    layout of a fresh buffer (strides None) or the strided layout of a view."""

    shape: tuple[int | None, ...]
    element: str
    space: int = 0
    strides: tuple[int, ...] | None = None
    offset: int | None = 0  # None: dynamic

    def layout_strides(self) -> tuple[int, ...]:
        if self.strides is not None:
            return self.strides
        return row_major([n if n is not None else 1 for n in self.shape])

    def __str__(self) -> str:
        dims = "".join(f"{'?' if n is None else n}x" for n in self.shape)
        parts = [dims + self.element]
        if self.strides is not None:
            offset = "?" if self.offset is None else str(self.offset)
            parts.append(f"strided<[{', '.join(map(str, self.strides))}], offset: {offset}>")
        if self.space:
            parts.append(str(self.space))
        return f"memref<{', '.join(parts)}>"


def tensor_type(shape: Sequence[int], dtype: DType) -> str:
    return f"tensor<{''.join(f'{n}x' for n in shape)}{element_type(dtype)}>"


def affine_map(dims: Sequence[str], results: Sequence[str]) -> str:
    return f"affine_map<({', '.join(dims)}) -> ({', '.join(results)})>"


def affine_expr(value: Affine) -> str:
    """`r_i * 512 + t_i * 4 + 3` in affine-map syntax (dims named after the loops)."""
    text = ""
    for var, coeff in value.terms:
        part = dim_id(var) if abs(coeff) == 1 else f"{dim_id(var)} * {abs(coeff)}"
        text = (f"{text} {'-' if coeff < 0 else '+'} {part}" if text
                else f"-{part}" if coeff < 0 else part)
    if value.const or not text:
        text = (f"{text} {'-' if value.const < 0 else '+'} {abs(value.const)}" if text
                else str(value.const))
    return text


# ---------------------------------------------------------------- literals


def float_literal(value: float, element: str) -> str:
    """A float constant MLIR parses exactly: hexadecimal bits for infinities and NaN,
    otherwise Python's shortest repr with the decimal point MLIR requires."""
    if math.isnan(value) or math.isinf(value):
        bits = {("f16", "nan"): "0x7E00", ("f16", "inf"): "0x7C00", ("f16", "-inf"): "0xFC00",
                ("f32", "nan"): "0x7FC00000", ("f32", "inf"): "0x7F800000",
                ("f32", "-inf"): "0xFF800000", ("f64", "nan"): "0x7FF8000000000000",
                ("f64", "inf"): "0x7FF0000000000000", ("f64", "-inf"): "0xFFF0000000000000"}
        return bits[(element, "nan" if math.isnan(value) else repr(value))]
    text = repr(float(value))
    if "." not in text:
        mantissa, _, exponent = text.partition("e")
        text = f"{mantissa}.0" + (f"e{exponent}" if exponent else "")
    return text


def constant(value: float | int, element: str) -> str:
    """`arith.constant` operands for `value` as an `element`."""
    if element.startswith("f"):
        return f"{float_literal(float(value), element)} : {element}"
    return f"{int(value)} : {element}"


# ---------------------------------------------------------------- scalar arithmetic


@dataclass(frozen=True)
class Val:
    """An SSA value inside a linalg region and its type (i32, f32, f64, ...)."""

    name: str
    type: str

    @property
    def is_float(self) -> bool:
        return self.type.startswith("f")


def _width(type_: str) -> int:
    return int(type_[1:])


class Arith:
    """One statement's scalar arithmetic as `arith`/`math` ops in a linalg region, with
    the reference's C-like rules (see the module docstring). `real` is the float type the
    statement's float parts are computed in."""

    def __init__(self, code: Code, names: SsaNames, real: str) -> None:
        self.code, self.names, self.real = code, names, real

    def op(self, text: str, type_: str, hint: str = "v") -> Val:
        name = self.names(hint)
        self.code(f"{name} = {text}")
        return Val(name, type_)

    def const(self, value: float | int, type_: str) -> Val:
        return self.op(f"arith.constant {constant(value, type_)}", type_, "c")

    # -- conversions -------------------------------------------------------------

    def promote(self, value: Val) -> Val:
        """C's promotions: narrow integers compute as i32, narrow floats as `real`."""
        if value.is_float:
            return self.to_real(value)
        if _width(value.type) < 32:
            return self.op(f"arith.extsi {value.name} : {value.type} to i32", "i32")
        return value

    def to_real(self, value: Val) -> Val:
        if not value.is_float:
            return self.op(f"arith.sitofp {value.name} : {value.type} to {self.real}",
                           self.real)
        if _width(value.type) < _width(self.real):
            return self.op(f"arith.extf {value.name} : {value.type} to {self.real}",
                           self.real)
        if _width(value.type) > _width(self.real):
            return self.op(f"arith.truncf {value.name} : {value.type} to {self.real}",
                           self.real)
        return value

    def store(self, value: Val, dtype: DType) -> Val:
        """`value` stored into an element of `dtype`: floats round, floats into integers
        truncate toward zero (through i64, then wrap), integers wrap."""
        target = element_type(dtype)
        if value.type == target:
            return value
        if dtype.is_float:
            if not value.is_float:
                return self.op(f"arith.sitofp {value.name} : {value.type} to {target}", target)
            verb = "truncf" if _width(value.type) > _width(target) else "extf"
            return self.op(f"arith.{verb} {value.name} : {value.type} to {target}", target)
        if value.is_float:
            value = self.op(f"arith.fptosi {value.name} : {value.type} to i64", "i64")
        if _width(value.type) > _width(target):
            return self.op(f"arith.trunci {value.name} : {value.type} to {target}", target)
        return self.op(f"arith.extsi {value.name} : {value.type} to {target}", target)

    def _pair(self, lhs: Val, rhs: Val) -> tuple[Val, Val]:
        """Both operands in one type: a float anywhere makes both `real`."""
        if lhs.is_float or rhs.is_float:
            return self.to_real(lhs), self.to_real(rhs)
        return lhs, rhs

    # -- expressions -------------------------------------------------------------

    def expr(self, expr: Expr, access: Callable[[Access], Val]) -> Val:
        if isinstance(expr, Num):
            value = expr.value
            return self.const(value, self.real if isinstance(value, float) else "i32")
        if isinstance(expr, SizeRef):
            return self.const(expr.value, "i32")
        if isinstance(expr, Access):
            return self.promote(access(expr))
        if isinstance(expr, Neg):
            arg = self.expr(expr.arg, access)
            if arg.is_float:
                return self.op(f"arith.negf {arg.name} : {arg.type}", arg.type)
            zero = self.const(0, arg.type)
            return self.op(f"arith.subi {zero.name}, {arg.name} : {arg.type}", arg.type)
        if isinstance(expr, BinOp):
            lhs, rhs = self._pair(self.expr(expr.lhs, access), self.expr(expr.rhs, access))
            return self.binop(expr.op, lhs, rhs)
        return self.call(expr, [self.expr(a, access) for a in expr.args])

    def binop(self, op: str, lhs: Val, rhs: Val) -> Val:
        if op == "/" and not lhs.is_float:
            return self.int_div(lhs, rhs)
        verb = {"+": "add", "-": "sub", "*": "mul", "/": "div"}[op]
        suffix = "f" if lhs.is_float else "i"
        return self.op(f"arith.{verb}{suffix} {lhs.name}, {rhs.name} : {lhs.type}", lhs.type)

    def int_div(self, lhs: Val, rhs: Val) -> Val:
        """C division truncating toward zero, and 0 for a zero divisor like the reference
        (MLIR, like C, leaves x / 0 and INT_MIN / -1 undefined: both are kept from
        `divsi`, the second by negating instead)."""
        t = lhs.type
        zero, one, minus_one = self.const(0, t), self.const(1, t), self.const(-1, t)
        by_zero = self.op(f"arith.cmpi eq, {rhs.name}, {zero.name} : {t}", "i1")
        by_minus_one = self.op(f"arith.cmpi eq, {rhs.name}, {minus_one.name} : {t}", "i1")
        special = self.op(f"arith.ori {by_zero.name}, {by_minus_one.name} : i1", "i1")
        divisor = self.op(f"arith.select {special.name}, {one.name}, {rhs.name} : {t}", t)
        quotient = self.op(f"arith.divsi {lhs.name}, {divisor.name} : {t}", t)
        negated = self.op(f"arith.subi {zero.name}, {lhs.name} : {t}", t)
        signed = self.op(f"arith.select {by_minus_one.name}, {negated.name}, "
                         f"{quotient.name} : {t}", t)
        return self.op(f"arith.select {by_zero.name}, {zero.name}, {signed.name} : {t}", t)

    def call(self, call: Call, args: list[Val]) -> Val:
        fn = call.fn
        if fn in ("max", "min"):
            lhs, rhs = self._pair(args[0], args[1])
            return self.extremum(fn, lhs, rhs)
        arg = args[0]
        if fn == "relu":
            return self.extremum("max", arg, self.const(0, arg.type))
        if fn == "abs":
            verb = "absf" if arg.is_float else "absi"
            return self.op(f"math.{verb} {arg.name} : {arg.type}", arg.type)
        arg = self.to_real(arg)  # the math functions work in floating point
        if fn in ("recip", "rsqrt"):
            root = (self.op(f"math.sqrt {arg.name} : {arg.type}", arg.type) if fn == "rsqrt"
                    else arg)
            one = self.const(1.0, arg.type)
            return self.op(f"arith.divf {one.name}, {root.name} : {arg.type}", arg.type)
        if fn in ("exp", "log", "sqrt", "tanh"):
            return self.op(f"math.{fn} {arg.name} : {arg.type}", arg.type)
        raise EmitError(f"the MLIR emitter cannot emit the function {fn!r}")

    def extremum(self, fn: str, lhs: Val, rhs: Val) -> Val:
        """NumPy's maximum/minimum: NaN propagates (maximumf), integers are signed."""
        verb = (f"{fn}imumf" if lhs.is_float else f"{fn}si")
        return self.op(f"arith.{verb} {lhs.name}, {rhs.name} : {lhs.type}", lhs.type)

    def reduce_step(self, op: ReduceOp, acc: Val, value: Val) -> Val:
        """`acc op= value`, both in the statement's compute type."""
        acc, value = self._pair(self.promote(acc), value)
        if op is ReduceOp.ASSIGN:
            return value
        if op in (ReduceOp.MAX, ReduceOp.MIN):
            return self.extremum("max" if op is ReduceOp.MAX else "min", acc, value)
        return self.binop("+" if op is ReduceOp.ADD else "*", acc, value)


def real_type(stmt: Statement) -> str:
    """The float type a statement's float parts compute in (as the C emitters do)."""
    return "f32" if stmt.dtype.is_float else "f64"


def distinct_accesses(stmt: Statement) -> list[Access]:
    """The statement's reads, each (tensor, indices) once: one linalg operand each."""
    return list(dict.fromkeys(accesses(stmt.expr)))


@dataclass(frozen=True)
class Operand:
    value: str
    type: str
    indices: tuple[str, ...]  # the statement's dims along the operand's axes
    element: str
    tensor: str


def generic(code: Code, names: SsaNames, stmt: Statement, ins: Sequence[Operand],
            out: Operand, result: str | None, tagged: bool) -> str | None:
    """`out op= expr(ins)` as one linalg.generic over the statement's dims (a result of
    type `result` on tensors, none on memrefs), `ins` in `distinct_accesses` order.
    Returns the result's SSA name."""
    dims = [dim_id(d) for d in stmt.dims]
    maps = [affine_map(dims, [dim_id(i) for i in operand.indices]) for operand in (*ins, out)]
    iterators = ", ".join('"reduction"' if d in stmt.reduced else '"parallel"'
                          for d in stmt.dims)
    attrs = f"indexing_maps = [{', '.join(maps)}], iterator_types = [{iterators}]"
    if tagged:
        attrs += f', synth.statement = "{stmt.name}"'
    name = names(f"{stmt.target}_v") if result is not None else None
    head = f"{name} = " if name is not None else ""
    ins_text = (f"ins({', '.join(o.value for o in ins)} : {', '.join(o.type for o in ins)}) "
                if ins else "")
    code(f"{head}linalg.generic {{{attrs}}}")
    code(f"{INDENT * 2}{ins_text}outs({out.value} : {out.type}) {{")
    args = [Val(names(f"{o.tensor}_in"), o.element) for o in ins]
    acc = Val(names(f"{stmt.target}_acc"), out.element)
    code(f"^bb0({', '.join(f'{a.name}: {a.type}' for a in (*args, acc))}):")
    code.depth += 1
    arith = Arith(code, names, real_type(stmt))
    element = dict(zip(distinct_accesses(stmt), args, strict=True))
    value = arith.expr(stmt.expr, lambda access: element[access])
    if stmt.op.reduces:
        value = arith.reduce_step(stmt.op, acc, value)
    stored = arith.store(value, stmt.dtype)
    code(f"linalg.yield {stored.name} : {stored.type}")
    code.depth -= 1
    code("}" + (f" -> {result}" if result is not None else ""))
    return name


# ---------------------------------------------------------------- schedule.mlir


@dataclass(frozen=True)
class Buf:
    """A buffer as an SSA value: its declaration and the memref it is."""

    decl: BufferDecl
    value: str
    type: MemRef


@dataclass(frozen=True)
class Pick:
    """One index of an axis, dropped from the view: the slot of the unit in scope."""

    at: str


@dataclass(frozen=True)
class Span:
    """A range of an axis: static or SSA start and size (a dynamic size: a ragged tile)."""

    start: int | str
    size: int | str


Axis = Pick | Span


@dataclass
class Scope:
    """What one block defines: the offsets, sizes and views it computed (reused by later
    nodes of the block and blocks inside it), and the buffers to free at its end."""

    indices: dict[tuple[object, ...], str] = field(default_factory=dict)
    allocs: list[Buf] = field(default_factory=list)


def memory_spaces(hw: Hardware) -> dict[str, int]:
    """The root memory is the default space 0, the next memories 1, 2, ... in order."""
    return {mem.name: index for index, mem in enumerate(hw.memories)}


def schedule_text(program: Program, workload: Workload, hw: Hardware) -> str:
    spaces = memory_spaces(hw)
    code = Code(INDENT)
    sizes = " ".join(f"{k}={v}" for k, v in workload.sizes.items())
    counts = ", ".join(f"{k}={v}" for k, v in program.counts.items())
    code(f"// synth schedule of {workload.name} ({sizes}) on {hw.name}"
         + (f" ({counts})" if counts else ""))
    code("// memory spaces: " + ", ".join(
        f"{name} = {space}" + (" (default)" if space == 0 else "")
        for name, space in spaces.items()))
    code("// parallel loops are scf.forall over a level's units, sequential ones scf.for "
         "over the tiles moving through a memory")
    code("module {")
    code.depth += 1
    symbols = SsaNames(sigil="")
    symbols(entry_name(workload))
    kernels = [KernelWriter(program, workload, kernel, spaces, symbols(f"kernel_{kernel.name}"))
               for kernel in program.kernels]
    for writer in kernels:
        code.extend(writer.render())
        code()
    code.extend(entry_function(program, workload, kernels, spaces))
    code.depth -= 1
    code("}")
    return code.text()


def global_type(decl: BufferDecl, spaces: Mapping[str, int]) -> MemRef:
    if decl.partial_loops:
        raise EmitError(f"global {decl.name}: expected whole tensors in the root memory, "
                        f"got partial results")
    return MemRef(decl.shape, element_type(decl.dtype), spaces[decl.memory])


def entry_function(program: Program, workload: Workload, kernels: Sequence[KernelWriter],
                   spaces: Mapping[str, int]) -> Code:
    """The workload's function: takes the inputs and the outputs (written in place),
    allocates the temporaries, and calls the kernels in order."""
    decls = {d.name: d for d in program.globals}
    params = [t.name for t in (*workload.inputs, *workload.outputs)]
    temps = [t.name for t in workload.tensors.values() if t.role is Role.TEMP]
    types = {name: global_type(decls[name], spaces) for name in params + temps}
    code = Code(INDENT)
    signature = ", ".join(f"%{ssa_id(n)}: {types[n]}" for n in params)
    code("// inputs, then outputs (written in place)")
    code(f"func.func @{entry_name(workload)}({signature}) attributes {{llvm.emit_c_interface}} {{")
    code.depth += 1
    for name in temps:
        code(f"%{ssa_id(name)} = memref.alloc() : {types[name]}  // temporary {name}")
    for writer in kernels:
        args = writer.arguments
        code(f"func.call @{writer.symbol}({', '.join(f'%{ssa_id(a)}' for a in args)}) : "
             f"({', '.join(str(types[a]) for a in args)}) -> ()")
    for name in temps:
        code(f"memref.dealloc %{ssa_id(name)} : {types[name]}")
    code("return")
    code.depth -= 1
    code("}")
    return code


class KernelWriter:
    """One kernel as a private function: its nodes rendered in order, one method per
    node kind, with the loops and buffers in scope."""

    def __init__(self, program: Program, workload: Workload, kernel: Kernel,
                 spaces: Mapping[str, int], symbol: str) -> None:
        self.program, self.workload, self.kernel, self.spaces = program, workload, kernel, spaces
        self.symbol = symbol
        self.names = SsaNames()
        self.loops = {n.var.name: n.var for n in walk(kernel.body) if isinstance(n, Loop)}
        self.extents = {name: var.extent for name, var in self.loops.items()}
        self.loop_values: dict[str, str] = {}  # loops in scope -> their SSA index
        self.buffers: dict[str, Buf] = {}
        self.scopes: list[Scope] = []
        self.index_constants: dict[int, str] = {}  # value -> its SSA name, defined on top
        self.code = Code(INDENT)
        used = _buffers_named(kernel.body)
        self.arguments = [d.name for d in program.globals if d.name in used]
        for decl in program.globals:
            if decl.name in used:
                self.buffers[decl.name] = Buf(decl, self.names(decl.name),
                                              global_type(decl, spaces))

    def render(self) -> Code:
        with self.scope():
            for node in self.kernel.body:
                self.node(node)
        out = Code(INDENT)
        out(f"// kernel {self.kernel.name}: " + "; ".join(
            statement_text(s.target, s.indices, s.op, s.expr)
            for s in map(self.workload.statement, self.kernel.statements)))
        params = ", ".join(f"{self.buffers[a].value}: {self.buffers[a].type}"
                           for a in self.arguments)
        out(f"func.func private @{self.symbol}({params}) {{")
        out.depth += 1
        for value, name in sorted(self.index_constants.items()):
            out(f"{name} = arith.constant {value} : index")
        out.extend(self.code)
        out("return")
        out.depth -= 1
        out("}")
        return out

    def node(self, node: Node) -> None:
        """Render one node wherever it is (computes and fills may sit at any depth)."""
        match node:
            case Loop():
                self.loop(node)
            case Alloc():
                self.alloc(node)
            case Load():
                self.load(node)
            case Store():
                self.store(node)
            case Fill():
                self.fill(node)
            case Compute():
                self.compute(node)
            case Combine():
                self.combine(node)
            case Running():
                mlir_online.running(self, node)
            case Rescale():
                mlir_online.rescale(self, node)
            case _:
                raise EmitError(f"the MLIR emitter cannot emit a {type(node).__name__} node")

    # -- scopes ------------------------------------------------------------------

    @contextmanager
    def scope(self) -> Iterator[None]:
        """A block: what it allocates is freed at its end, in reverse order."""
        self.scopes.append(Scope())
        yield
        for buf in reversed(self.scopes[-1].allocs):
            self.code(f"memref.dealloc {buf.value} : {buf.type}")
        self.scopes.pop()

    def cached(self, key: tuple[object, ...], make: Callable[[], str]) -> str:
        """An index value computed once per block (inner blocks see outer ones)."""
        for scope in reversed(self.scopes):
            if key in scope.indices:
                return scope.indices[key]
        value = make()
        self.scopes[-1].indices[key] = value
        return value

    def index_constant(self, value: int) -> str:
        if value not in self.index_constants:
            self.index_constants[value] = self.names(f"c{value}")
        return self.index_constants[value]

    # -- indices -----------------------------------------------------------------

    def operands_of(self, value: Affine) -> list[str]:
        missing = [v for v, _ in value.terms if v not in self.loop_values]
        if missing:
            raise EmitError(f"kernel {self.kernel.name}: expected loop {missing[0]} around "
                            f"the use of {value}, got none")
        return [self.loop_values[v] for v, _ in value.terms]

    def index(self, value: Affine, hint: str) -> int | str:
        """An offset: a static integer, or one `affine.apply` of the loops it uses."""
        if not value.terms:
            if value.const < 0:
                raise EmitError(f"kernel {self.kernel.name}: expected a non-negative offset, "
                                f"got {value.const}")
            return value.const

        def make() -> str:
            dims = [dim_id(v) for v, _ in value.terms]
            name = self.names(hint)
            self.code(f"{name} = affine.apply {affine_map(dims, [affine_expr(value)])}"
                      f"({', '.join(self.operands_of(value))})")
            return name

        return self.cached(("index", value), make)

    def valid_size(self, origin: Affine, size: int, extent: int, hint: str) -> int | str:
        """How many of a tile's `size` elements from `origin` lie inside a dimension of
        `extent`: `size` unless the tile can cross the edge (then an `affine.min` of the
        loops, clamped at 0 when a tile can lie wholly outside)."""
        last = origin.max_value(self.extents)
        if last + size <= extent:
            return size
        if not origin.terms:
            return max(0, min(size, extent - origin.const))

        def make() -> str:
            dims = [dim_id(v) for v, _ in origin.terms]
            rest = affine_expr(Affine(tuple((v, -c) for v, c in origin.terms),
                                      extent - origin.const))
            name = self.names(hint)
            self.code(f"{name} = affine.min {affine_map(dims, [str(size), rest])}"
                      f"({', '.join(self.operands_of(origin))})  // ragged: the tile's "
                      f"part inside the tensor")
            if last >= extent:
                clamped = self.names(hint)
                self.code(f"{clamped} = affine.max affine_map<(n) -> (n, 0)>({name})  // none "
                          f"when the tile lies past the edge (padding)")
                return clamped
            return name

        return self.cached(("size", origin, size, extent), make)

    # -- views -------------------------------------------------------------------

    def view(self, buf: Buf, axes: Sequence[Axis], hint: str) -> tuple[str, MemRef]:
        """A `memref.subview` of `buf` (the buffer itself when the view is all of it)."""
        full = [n for n in buf.type.shape]
        if all(isinstance(a, Span) and a.start == 0 and a.size == n
               for a, n in zip(axes, full, strict=True)):
            return buf.value, buf.type
        strides = buf.type.layout_strides()
        starts = [a.at if isinstance(a, Pick) else a.start for a in axes]
        offset: int | None = buf.type.offset
        for start, stride in zip(starts, strides, strict=True):
            offset = None if offset is None or isinstance(start, str) else offset + start * stride
        kept = [(a, s) for a, s in zip(axes, strides, strict=True) if isinstance(a, Span)]
        result = MemRef(tuple(a.size if isinstance(a.size, int) else None for a, _ in kept),
                        buf.type.element, buf.type.space, tuple(s for _, s in kept), offset)
        sizes = [1 if isinstance(a, Pick) else a.size for a in axes]

        def make() -> str:
            name = self.names(hint)
            self.code(f"{name} = memref.subview {buf.value}[{', '.join(map(str, starts))}] "
                      f"[{', '.join(map(str, sizes))}] [{', '.join('1' for _ in axes)}] : "
                      f"{buf.type} to {result}")
            return name

        return self.cached(("view", buf.value, tuple(axes)), make), result

    def picks(self, buf: Buf, what: str) -> list[Axis]:
        """The partial axes of a buffer a compute or combine target reads: the slot of the
        unit in scope (the interpreter has no other way to reach them either)."""
        axes: list[Axis] = []
        for loop in buf.decl.partial_loops:
            if loop not in self.loop_values:
                raise EmitError(f"{what}: expected partial loop {loop} of {buf.decl.name} "
                                f"around it, got none")
            axes.append(Pick(self.loop_values[loop]))
        return axes

    # -- nodes -------------------------------------------------------------------

    def loop(self, node: Loop) -> None:
        var = node.var
        value = self.names(var.name)
        step = f", step {var.step}" if var.step > 1 else ""
        self.code(f"// {var.kind.value} {var.name} in 0..{var.symbol}={var.extent}: "
                  f"{var.dim}{step}")
        if var.kind is LoopKind.PARALLEL:
            head = f"scf.forall ({value}) in ({var.extent}) {{"
            tail = f'}} {{synth.level = "{var.where}", synth.symbol = "{var.symbol}"}}'
        else:
            head = (f"scf.for {value} = {self.index_constant(0)} to "
                    f"{self.index_constant(var.extent)} step {self.index_constant(1)} {{")
            tail = f'}} {{synth.memory = "{var.where}", synth.symbol = "{var.symbol}"}}'
        self.code(head)
        self.code.depth += 1
        self.loop_values[var.name] = value
        with self.scope():
            for child in node.body:
                self.node(child)
        del self.loop_values[var.name]
        self.code.depth -= 1
        self.code(tail)

    def alloc(self, node: Alloc) -> None:
        decl = node.buffer
        partials = tuple(self.loops[p].extent for p in decl.partial_loops)
        type_ = MemRef(partials + decl.shape, element_type(decl.dtype), self.spaces[decl.memory])
        at = ", ".join(str(o) for o in decl.origin)
        notes = [f"{decl.dtype.value}{list(decl.shape)} of {decl.tensor}"
                 + (f" at [{at}]" if any(str(o) != "0" for o in decl.origin) else "")]
        if decl.partial_loops:
            notes.append(f"partial results over ({', '.join(decl.partial_loops)}) first")
        if decl.buffers > 1:
            notes.append(f"x{decl.buffers} double buffered (timing only: one tile here)")
        buf = Buf(decl, self.names(decl.name), type_)
        self.code(f"{buf.value} = memref.alloc() : {type_}  // {decl.memory}: "
                  + ", ".join(notes))
        self.buffers[decl.name] = buf
        self.scopes[-1].allocs.append(buf)

    def load(self, node: Load) -> None:
        self.code(f"// load {node.dst} <- {node.src}")
        self.transfer(self.buffers[node.dst], self.buffers[node.src], load=True)

    def store(self, node: Store) -> None:
        self.code(f"// store {node.src} -> {node.dst}")
        self.transfer(self.buffers[node.src], self.buffers[node.dst], load=False)

    def transfer(self, child: Buf, parent: Buf, load: bool) -> None:
        """Copy the child's tile from or to its place in the parent: the parent's partial
        slot of the unit in scope, and only the part inside the tensor."""
        what = f"{'load' if load else 'store'} {child.decl.name}"
        parent_axes: list[Axis] = []
        for loop in parent.decl.partial_loops:
            if loop in self.loop_values:
                parent_axes.append(Pick(self.loop_values[loop]))
            else:
                parent_axes.append(Span(0, self.loops[loop].extent))
        kept = tuple(p for p in parent.decl.partial_loops if p not in self.loop_values)
        if kept != child.decl.partial_loops:
            raise EmitError(f"{what}: expected the partial axes ({', '.join(kept)}) of "
                            f"{parent.decl.name} on both sides, got "
                            f"({', '.join(child.decl.partial_loops)})")
        child_axes: list[Axis] = [Span(0, self.loops[p].extent) for p in kept]
        extents = self.workload.tensors[child.decl.tensor].shape
        for axis, size in enumerate(child.decl.shape):
            origin = child.decl.origin[axis]
            valid = self.valid_size(origin, size, extents[axis],
                                    f"{child.decl.dims[axis]}_len")
            offset = self.index(origin - parent.decl.origin[axis],
                                f"{child.decl.dims[axis]}_at")
            parent_axes.append(Span(offset, valid))
            child_axes.append(Span(0, valid))
        near, near_type = self.view(child, child_axes, f"{child.decl.name}_tile")
        far, far_type = self.view(parent, parent_axes, f"{parent.decl.name}_tile")
        src, dst = ((far, far_type), (near, near_type)) if load else ((near, near_type),
                                                                      (far, far_type))
        self.code(f"linalg.copy ins({src[0]} : {src[1]}) outs({dst[0]} : {dst[1]})")

    def fill(self, node: Fill) -> None:
        buf = self.buffers[node.buffer]
        value = self.names(f"{buf.decl.name}_init")
        self.code(f"// fill {node.buffer} = {node.value}")
        self.code(f"{value} = arith.constant {constant(node.value, buf.type.element)}")
        self.code(f"linalg.fill ins({value} : {buf.type.element}) outs({buf.value} : "
                  f"{buf.type})")

    def compute(self, node: Compute) -> None:
        stmt = self.workload.statement(node.statement)
        what = f"compute {node.statement}"
        self.code(f"// {what}: {statement_text(stmt.target, stmt.indices, stmt.op, stmt.expr)}")
        missing = [d for d in stmt.dims if d not in node.dims]
        if missing:
            raise EmitError(f"{what}: expected a tile along every dimension of the statement, "
                            f"got none along {missing[0]}")
        sizes = {d: self.valid_size(node.origin[k], node.tile[k], stmt.extents[d],
                                    f"{d}_len")
                 for k, d in enumerate(node.dims)}

        def operand(buffer: str, indices: tuple[str, ...]) -> Operand:
            buf = self.buffers[buffer]
            axes = self.picks(buf, what)
            for axis, index in enumerate(indices):
                k = node.dims.index(index)
                start = self.index(node.origin[k] - buf.decl.origin[axis], f"{index}_at")
                axes.append(Span(start, sizes[index]))
            value, type_ = self.view(buf, axes, f"{buffer}_tile")
            return Operand(value, str(type_), indices, type_.element, buf.decl.tensor)

        ins = [operand(node.operands[a.tensor], a.indices) for a in distinct_accesses(stmt)]
        out = operand(node.out, stmt.indices)
        generic(self.code, self.names, stmt, ins, out, None, tagged=False)

    def combine(self, node: Combine) -> None:
        """target op= reduce(partials over their leading partial axes), over the part
        of the target inside the tensor."""
        partials, target = self.buffers[node.partials], self.buffers[node.target]
        what = f"combine {node.partials}"
        self.code(f"// combine {node.target} {node.op.value} reduce({node.partials})")
        if partials.decl.shape != target.decl.shape:
            raise EmitError(f"{what}: expected partial tiles of the target's shape "
                            f"{target.decl.shape}, got {partials.decl.shape}")
        extents = self.workload.tensors[target.decl.tensor].shape
        sizes = [self.valid_size(o, n, e, f"{d}_len") for o, n, e, d in
                 zip(target.decl.origin, target.decl.shape, extents, target.decl.dims,
                     strict=True)]
        slots: list[Axis] = [Span(0, self.loops[p].extent) for p in partials.decl.partial_loops]
        parts, parts_type = self.view(partials, slots + [Span(0, n) for n in sizes],
                                      f"{partials.decl.name}_tile")
        into, into_type = self.view(target, self.picks(target, what)
                                    + [Span(0, n) for n in sizes], f"{target.decl.name}_tile")
        slot_dims = [dim_id(p) for p in partials.decl.partial_loops]
        tile_dims = [dim_id(f"{d}_{k}") if dim_id(d) in slot_dims else dim_id(d)
                     for k, d in enumerate(target.decl.dims)]
        dims = slot_dims + tile_dims
        iterators = ", ".join(['"reduction"'] * len(slot_dims) + ['"parallel"'] * len(tile_dims))
        maps = f"{affine_map(dims, dims)}, {affine_map(dims, tile_dims)}"
        self.code(f"linalg.generic {{indexing_maps = [{maps}], iterator_types = [{iterators}]}}")
        self.code(f"{INDENT * 2}ins({parts} : {parts_type}) outs({into} : {into_type}) {{")
        element = target.type.element
        part, acc = self.names("part"), self.names("acc")
        self.code(f"^bb0({part}: {element}, {acc}: {element}):")
        self.code.depth += 1
        step = Arith(self.code, self.names, element if element.startswith("f") else "f64")
        value = step.reduce_step(node.op, Val(acc, element), Val(part, element))
        stored = step.store(value, target.decl.dtype)
        self.code(f"linalg.yield {stored.name} : {element}")
        self.code.depth -= 1
        self.code("}")


def _buffers_named(nodes: tuple[Node, ...]) -> set[str]:
    """Every buffer name the nodes use (globals among them become the kernel's
    arguments)."""
    used: set[str] = set()
    for node in walk(nodes):
        if isinstance(node, Load | Store):
            used |= {node.src, node.dst}
        elif isinstance(node, Fill):
            used.add(node.buffer)
        elif isinstance(node, Compute):
            used |= {node.out, *node.operands.values()}
        elif isinstance(node, Combine):
            used |= {node.target, node.partials}
    return used


# ---------------------------------------------------------------- source.mlir


def source_text(workload: Workload) -> str:
    """The workload on tensors: one linalg op per statement in program order, each
    tagged with its statement so that transform.mlir can find it."""
    code = Code(INDENT)
    names = SsaNames()
    sizes = " ".join(f"{k}={v}" for k, v in workload.sizes.items())
    code(f"// {workload.name} ({sizes}) as untiled linalg on tensors, one op per statement")
    code("module {")
    code.depth += 1
    current: dict[str, str] = {}
    params = []
    for tensor in workload.inputs:
        current[tensor.name] = names(tensor.name)
        params.append(f"{current[tensor.name]}: {tensor_type(tensor.shape, tensor.dtype)}")
    results = ", ".join(tensor_type(t.shape, t.dtype) for t in workload.outputs)
    code(f"func.func @{entry_name(workload)}({', '.join(params)}) -> ({results}) "
         f"attributes {{llvm.emit_c_interface}} {{")
    code.depth += 1
    for stmt in workload.statements:
        current[stmt.target] = statement_op(code, names, workload, stmt, current)
    outputs = [current[t.name] for t in workload.outputs]
    code(f"return {', '.join(outputs)} : {results}")
    code.depth -= 1
    code("}")
    code.depth -= 1
    code("}")
    return code.text()


def statement_op(code: Code, names: SsaNames, workload: Workload, stmt: Statement,
                 current: Mapping[str, str]) -> str:
    """One statement as a linalg op on tensors; returns the target's new value."""
    tensor = workload.tensors[stmt.target]
    type_ = tensor_type(tensor.shape, tensor.dtype)
    element = element_type(tensor.dtype)
    code(f"// {statement_text(stmt.target, stmt.indices, stmt.op, stmt.expr)}")
    if stmt.accumulates and stmt.op.reduces:
        init = current[stmt.target]  # adds to what the earlier statement computed
    else:
        init = names(f"{stmt.target}_empty")
        code(f"{init} = tensor.empty() : {type_}")
        if stmt.op.reduces:  # a fresh reduction starts from the operator's identity
            start = names(f"{stmt.target}_identity")
            code(f"{start} = arith.constant "
                 f"{constant(stmt.op.identity(tensor.dtype), element)}")
            filled = names(f"{stmt.target}_start")
            code(f"{filled} = linalg.fill ins({start} : {element}) outs({init} : {type_}) "
                 f"-> {type_}")
            init = filled
    if stmt.op is ReduceOp.ASSIGN and isinstance(stmt.expr, Num | SizeRef):
        number = names(f"{stmt.target}_value")
        code(f"{number} = arith.constant {constant(stmt.expr.value, element)}")
        filled = names(f"{stmt.target}_v")
        code(f'{filled} = linalg.fill {{synth.statement = "{stmt.name}"}} ins({number} : '
             f"{element}) outs({init} : {type_}) -> {type_}")
        return filled
    ins = []
    for acc in distinct_accesses(stmt):
        source = workload.tensors[acc.tensor]
        ins.append(Operand(current[acc.tensor], tensor_type(source.shape, source.dtype),
                           acc.indices, element_type(source.dtype), acc.tensor))
    out = Operand(init, type_, stmt.indices, element, stmt.target)
    value = generic(code, names, stmt, ins, out, type_, tagged=True)
    assert value is not None
    return value
