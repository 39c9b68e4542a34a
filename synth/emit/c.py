"""The C emitter for CPUs: a solved loop nest as C11 with OpenMP and explicit SIMD.

`emit_c(program, workload, hw, out_dir, inputs, expected)` writes into `out_dir`:

- `kernels.c`: one function per kernel and `synth_run(void **tensors)`, which runs them
  in order on the workload's tensors (passed in declaration order, row-major);
- `synth_vec.h`: synth's vector helpers (explicit SIMD and vectorised exp/log/tanh/sqrt);
- `Makefile`: `make` builds `libsynth.so` with `-O3 -march=native -fopenmp`;
- `data/`: the validation inputs and the reference outputs (`.npy`).

`synth.emit.c_check` builds the library, loads it with ctypes, runs it on the inputs,
compares with the reference and times it beside NumPy.

How the IR maps onto C (this is what `synth.constraints.cost` prices, see
docs/architecture.md):

- A kernel with parallel loops (`forall` over cores) runs as one `#pragma omp parallel
  num_threads(units)` region per call: every thread walks the sequential loops (plain
  loops over tiles), and each parallel loop is an `omp for collapse(k)` that gives each
  thread its unit (a barrier at its end, not a fork and join per step of the loops
  around it); root fills and combines are shared out the same way (`one_region`; a
  kernel whose code outside its units' loops does more runs a region per parallel
  loop, as before). A fill of a tensor that nothing reads is not written
  (`unread_tensors`: a fused intermediate that lives in registers).
- Tiles in the root memory are the tensors themselves (and, for reductions split across
  cores, a `<tensor>_partials` array per kernel, combined after it).
- Tiles in the memories between the root and the innermost (the caches) are *views*:
  the loops block for them, and the hardware moves their lines. Their loads and stores
  are the cache's business and emit nothing. The exception: a contraction's operand
  tile in the units' private cache (each core's L2) is packed when the schedule loads
  it, copied into a contiguous buffer in the order the micro-kernel reads it, so each
  register tile of it is one contiguous run (`synth.emit.c_pack`, as BLIS packs).
- Tiles in the innermost memory (the vector registers on the `cpu` model) are local
  arrays, loaded and stored explicitly. Along the kernel's vector dimension (`vector`,
  chosen by the solver) they are arrays of SIMD vectors (`vf32`), so the compute over a
  tile is written in explicit vector arithmetic: a register-blocked micro-kernel for a
  contraction (accumulators as vector locals, the operand without the vector dimension
  broadcast), vector accumulators for a reduction over the vector dimension (one per
  vector of the tile, folded when the tile is stored or read), and synth's vector math
  routines. The compiler keeps these small arrays in registers (their indices are
  constants once their constant-bound loops are unrolled).
- A register tile's vectors are stored in address order: `-fno-schedule-insns2` keeps gcc
  from reordering them (out of order, stores that split cache lines ran up to 40% slower
  from the L3; volatile stores kept the order too, but they kept gcc from interchanging
  loops: rownorm's r_y 2.5x slower). The innermost loop over register tiles along the
  vector dimension, and loops around it along that dimension alone, are unrolled to
  `UNROLL_VECTORS` vectors per iteration where an iteration has fewer (a loop over groups
  of iterations around one the compiler unrolls completely, `#pragma GCC unroll`): one
  vector of exps per iteration ran 10-12% slower than four from the L3 (RESULTS.md, "Cost
  fidelity round 5"). The innermost loop over a reduction's steps around a register
  tile is unrolled to `UNROLL_STEPS` steps per iteration likewise (one FMA per step of
  a loop of 64 ran 2.6 cycles a step, 1.5 unrolled: RESULTS.md, "Chains through
  memory"). Neither changes the tiles or the order of the arithmetic.
- A tile that may cross the tensor's edge (padded extents) is checked at run time: a
  full tile takes the vector path, a ragged one a scalar loop over its elements inside
  the tensor.
"""

from __future__ import annotations

import math
import os
import pickle
import shlex
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from synth.emit.c_check import ALIGN, LIBRARY, WORKLOAD_FILE, padded
from synth.emit.c_pack import Pack, PackWriter, plan_packs
from synth.emit.c_parallel import one_region, parallel_units, unread_tensors
from synth.emit.cstyle import ATOM, Code, CStyle, EmitError, Names, Typed, statement_text
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
    OnlineCombine,
    Program,
    Rescale,
    Running,
    Store,
    walk,
)
from synth.ir.verify import kernel_vector
from synth.reference import evaluate_errors
from synth.vectors import vectorisable
from synth.workload import (
    Access,
    BinOp,
    DType,
    Expr,
    Neg,
    Num,
    ReduceOp,
    SizeRef,
    Statement,
    Workload,
)
from synth.workload import walk as expr_nodes

__all__ = ["CFLAGS", "EmitError", "emit_c", "translation_units", "vector_bytes",
           "vectorisable"]

# -fno-schedule-insns2: gcc's post-allocation scheduler reordered a register tile's stores
# (an 8-vector tile's first vector stored last); stores that split cache lines (NumPy's
# arrays are 16-byte aligned) ran up to 40% slower out of address order from the L3. The
# out-of-order core schedules the rest (RESULTS.md, "Cost fidelity round 5")
# -fno-loop-interchange, -fno-loop-unroll-and-jam: the loop order and the register tiles
# are the schedule's decisions, priced by the model; gcc's -O3 interchanged the loops of
# some kernels (rownorm's y[s, d] kernel walking a [64 x 16] strip down its rows ran its
# rows innermost-last: 0.05 ms where the schedule priced and run as written take 0.4).
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fwrapv", "-std=gnu11",
          "-fno-schedule-insns2", "-fno-loop-interchange", "-fno-loop-unroll-and-jam",
          "-fPIC", "-shared")
HEADER = "synth_vec.h"
INDEX = "int64_t"  # loop counters and offsets
# the dtypes with vector arithmetic in synth_vec.h: dtype -> (suffix, C type)
VECTOR_TYPES: Mapping[DType, tuple[str, str]] = {DType.F32: ("f32", "float"),
                                                 DType.I32: ("i32", "int32_t")}
MAX_LOCAL_BYTES = 1 << 20  # innermost tiles live on the thread's stack
UNROLL_VECTORS = 4  # vectors per iteration of the innermost loop over register tiles
UNROLL_STEPS = 8  # steps per iteration of the innermost loop over a reduction's steps
RESERVED = ("synth_run", "synth_threads", "kernel", "tensors", "vf32", "vi32", "uf32",
            "ui32", "SYNTH_VB", "SYNTH_W", "omp_get_thread_num")


def vector_bytes(hw: Hardware) -> int:
    """The SIMD width the emitted code uses: the model's f32 lanes x 4 bytes (the
    `cpu` model reads them from this machine), at least 16."""
    return max(16, hw.compute.lanes.get("f32", 1) * 4)


@dataclass(frozen=True)
class Emission:
    out_dir: Path
    files: tuple[Path, ...]


def emit_c(program: Program, workload: Workload, hw: Hardware, out_dir: str | Path,
           inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
           bounds: Mapping[str, np.ndarray] | None = None) -> Emission:
    """Write kernels.c, synth_vec.h, the Makefile and the check's data into `out_dir`:
    the inputs, the reference outputs and their error bounds (`bound_<name>.npy`, the
    check's per-element tolerances; computed here when not given)."""
    if bounds is None:
        bounds = evaluate_errors(workload, inputs)[1]
    out = Path(out_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    source = ProgramWriter(program, workload, hw).render()
    files = [out / "kernels.c", out / HEADER, out / "Makefile"]
    files[0].write_text(source)
    with resources.as_file(resources.files("synth.emit") / "c_runtime" / HEADER) as header:
        shutil.copyfile(header, files[1])
    files[2].write_text(makefile())
    files.append(out / "data" / WORKLOAD_FILE)
    files[-1].write_bytes(pickle.dumps(workload))  # what the check runs NumPy on
    for tensor in workload.inputs:
        np.save(out / "data" / f"input_{tensor.name}.npy", inputs[tensor.name])
        files.append(out / "data" / f"input_{tensor.name}.npy")
    for tensor in workload.outputs:
        np.save(out / "data" / f"expected_{tensor.name}.npy", expected[tensor.name])
        files.append(out / "data" / f"expected_{tensor.name}.npy")
        if tensor.name in bounds:
            np.save(out / "data" / f"bound_{tensor.name}.npy",
                    np.asarray(bounds[tensor.name], dtype=np.float64))
            files.append(out / "data" / f"bound_{tensor.name}.npy")
    return Emission(out, tuple(files))


def compiler() -> list[str]:
    """The command the Makefile compiles with: $CC and $CFLAGS where set, as make takes
    them."""
    flags = shlex.split(os.environ["CFLAGS"]) if "CFLAGS" in os.environ else list(CFLAGS)
    return [os.environ.get("CC", "cc"), *flags]


def makefile() -> str:
    return (f"# Builds the kernels synth emitted into a shared library (loaded with ctypes).\n"
            f"CC ?= cc\nCFLAGS ?= {' '.join(CFLAGS)}\n\n{LIBRARY}: kernels.c {HEADER}\n"
            f"\t$(CC) $(CFLAGS) -o $@ kernels.c -lm\n\nclean:\n\trm -f {LIBRARY}\n")


# ---------------------------------------------------------------- the program


def translation_units(program: Program, workload: Workload, hw: Hardware) -> dict[str, str]:
    """kernels.c cut into C files that build the same library: one per kernel (its
    helpers and packed buffers beside it, file-static; the kernel itself not static) and
    `synth_run.c`, which calls them. A kernel's file depends on that kernel alone (with
    the workload's tensors, the tensors no kernel reads and the vector width), so
    schedules that share a kernel share its file's text: `synth.measure` compiles each
    distinct file once across the schedules it builds."""
    units = {f"kernel{index}.c": ProgramWriter(program, workload, hw, kernel).render()
             for index, kernel in enumerate(program.kernels)}
    units["synth_run.c"] = ProgramWriter(program, workload, hw).render(kernels=False)
    return units


class ProgramWriter(CStyle):
    """Renders kernels.c, or with `only` the file of that kernel alone
    (`translation_units`)."""

    emitter_name = "the C emitter"
    index_type = INDEX

    def __init__(self, program: Program, workload: Workload, hw: Hardware,
                 only: Kernel | None = None) -> None:
        super().__init__()
        self.program = program
        self.workload = workload
        self.hw = hw
        self.only = only
        self.vb = vector_bytes(hw)
        self.lanes = self.vb // 4
        self.names = Names(RESERVED)
        self.tensor_names = {t: self.names(f"tensor:{t}", t) for t in workload.tensors}
        self.unread = unread_tensors(program, workload)

    def render(self, kernels: bool = True) -> str:
        """The file: every kernel and the driver; with `only`, that kernel alone; without
        `kernels`, the driver alone, declaring the kernels it calls."""
        code = Code()
        what = (f"kernel {self.only.name} of {self.workload.name}" if self.only is not None
                else self.workload.name)
        code(f"/* {'kernels.c' if self.only is None and kernels else 'part of kernels.c'}: "
             f"{what} on {self.hw.name}, generated by synth.")
        code(" *")
        for stmt in self.workload.statements:
            code(f" *   {statement_text(stmt.target, stmt.indices, stmt.op, stmt.expr)}")
        code(" *")
        code(f" * Built by `make` ({' '.join(CFLAGS)}); synth_run(tensors) runs every kernel.")
        code(" */")
        code(f"#define SYNTH_VB {self.vb}")
        code(f'#include "{HEADER}"')
        code("#include <stdlib.h>")
        code("#include <omp.h>")
        code()
        chosen = (self.only,) if self.only is not None else self.program.kernels
        bodies = [KernelWriter(self, kernel).render() for kernel in chosen] if kernels else []
        for definition in self.helpers.values():
            for line in definition.splitlines():
                code(line)
            code()
        for body in bodies:
            code.lines.extend(body.lines)
            code()
        if not kernels:
            for kernel in self.program.kernels:
                code(f"void {self.kernel_ident(kernel)}({self.signature()});")
            code()
        if self.only is None:
            self.driver(code)
        return code.text()

    def kernel_ident(self, kernel: Kernel) -> str:
        return self.names(f"kernel:{kernel.name}", f"kernel_{kernel.name}")

    # -- vector arithmetic (synth_vec.h) -------------------------------------------

    def vector_expr(self, expr: Expr, access: Callable[[Access], tuple[str, bool]],
                    suffix: str) -> str:
        """`expr` as a vector of `suffix` (f32, i32) values; scalars are broadcast."""
        text, is_vector = self._vector(expr, access, suffix)
        return text if is_vector else f"vsplat_{suffix}({text})"

    def _vector(self, expr: Expr, access: Callable[[Access], tuple[str, bool]],
                suffix: str) -> tuple[str, bool]:
        real = "float" if suffix == "f32" else "int"
        if isinstance(expr, Num | SizeRef):
            value = expr.value if suffix == "f32" else int(expr.value)
            literal = self.literal(float(value) if suffix == "f32" else value, real)
            return (literal.code if literal.prec >= ATOM else f"({literal.code})"), False
        if isinstance(expr, Access):
            return access(expr)
        if isinstance(expr, Neg):
            text, vec = self._vector(expr.arg, access, suffix)
            return f"(-{text})", vec
        if isinstance(expr, BinOp):
            (lhs, lv), (rhs, rv) = (self._vector(expr.lhs, access, suffix),
                                    self._vector(expr.rhs, access, suffix))
            if expr.op == "/" and suffix == "i32":
                return (f"vdiv_i32({self._splat(lhs, lv, suffix)}, "
                        f"{self._splat(rhs, rv, suffix)})"), True
            return f"({lhs} {expr.op} {rhs})", lv or rv
        args = [self._vector(a, access, suffix) for a in expr.args]
        splat = [self._splat(t, v, suffix) for t, v in args]
        fn = expr.fn
        one = "1.0f" if suffix == "f32" else "1"
        if fn in ("exp", "log", "sqrt", "tanh", "abs"):
            return f"v{fn}_{suffix}({splat[0]})", True
        if fn == "rsqrt":
            return f"({one} / vsqrt_{suffix}({splat[0]}))", True
        if fn == "recip":
            return f"({one} / {args[0][0]})", args[0][1]
        if fn == "relu":
            zero = "0.0f" if suffix == "f32" else "0"
            return f"vmax_{suffix}({splat[0]}, vsplat_{suffix}({zero}))", True
        return f"v{fn}_{suffix}({splat[0]}, {splat[1]})", True  # max, min

    @staticmethod
    def _splat(text: str, is_vector: bool, suffix: str) -> str:
        return text if is_vector else f"vsplat_{suffix}({text})"

    @staticmethod
    def vector_step(op: ReduceOp, acc: str, value: str, suffix: str) -> str:
        """`acc op= value` on vectors, as an expression."""
        if op is ReduceOp.ASSIGN:
            return value
        if op is ReduceOp.ADD:
            return f"{acc} + {value}"
        if op is ReduceOp.MUL:
            return f"{acc} * {value}"
        return f"v{'max' if op is ReduceOp.MAX else 'min'}_{suffix}({acc}, {value})"

    def signature(self) -> str:
        return ", ".join(f"{self.ctype(t.dtype)} *restrict {self.tensor_names[t.name]}"
                         for t in self.workload.tensors.values())

    def driver(self, code: Code) -> None:
        code.comment("Every kernel in order; tensors[k] is the k-th tensor the workload "
                     "declares or assigns, row-major")
        with code.function("void synth_run(void **tensors)"):
            args = ", ".join(f"({self.ctype(t.dtype)} *)tensors[{k}]"
                             for k, t in enumerate(self.workload.tensors.values()))
            for kernel in self.program.kernels:
                code(f"{self.kernel_ident(kernel)}({args});")
        code()
        code.comment("The most threads a kernel uses")
        threads = max((units for k in self.program.kernels for units in [parallel_units(k)]),
                      default=1)
        with code.function("int synth_threads(void)"):
            code(f"return {threads};")


# ---------------------------------------------------------------- one kernel


@dataclass(frozen=True)
class Local:
    """An innermost tile as a C array: of vectors along `vector` (when it is one of its
    dims and its extent there is a whole number of vectors), else of scalars."""

    decl: BufferDecl
    name: str
    vector: str | None
    lanes: int
    # an operand without the vector dimension, read by vector code: each element is
    # broadcast into a whole vector when loaded (a vector load that broadcasts, on the
    # load ports, instead of a scalar load and a broadcast on an arithmetic port per use)
    splat: bool = False

    @property
    def chunks(self) -> int:
        return self.decl.shape[self.decl.dims.index(self.vector)] // self.lanes \
            if self.vector else 1

    @property
    def size(self) -> int:
        """Array elements: vectors or scalars."""
        total = math.prod(self.decl.shape)
        return total // self.lanes if self.vector else total

    def slot(self, index: Mapping[str, str]) -> str:
        """The array element holding the point `index` (dim -> C expression of its tile
        offset; along the vector dimension, the chunk)."""
        flat = ""
        for dim, extent in zip(self.decl.dims, self.decl.shape, strict=True):
            count = extent // self.lanes if dim == self.vector else extent
            flat = index[dim] if not flat else f"({flat}) * {count} + {index[dim]}"
        return flat or "0"

    def scalar(self, index: Mapping[str, str]) -> str:
        """The element at tile offsets `index` (dim -> C expression), as a scalar."""
        if self.splat:
            return f"{self.name}[{self.slot(index)}][0]"
        if not self.vector:
            return f"{self.name}[{self.slot(index)}]"
        at = dict(index)
        lane = at[self.vector]
        at[self.vector] = f"({lane}) / {self.lanes}"
        return f"{self.name}[{self.slot(at)}][({lane}) % {self.lanes}]"


def _divisor(extent: int, most: int) -> int:
    """The largest divisor of `extent` that is at most `most` (1 at least)."""
    unroll = max(min(extent, most), 1)
    while extent % unroll:
        unroll -= 1
    return unroll


def _indexing(workload: Workload, compute: Compute, tensor: str) -> set[str]:
    """The dims that index `tensor` in `compute`'s statement."""
    return {d for a in _accesses(workload.statement(compute.statement).expr)
            if a.tensor == tensor for d in a.indices}


class KernelWriter:
    """Renders one kernel's function."""

    def __init__(self, writer: ProgramWriter, kernel: Kernel) -> None:
        self.w = writer
        self.kernel = kernel
        self.ident = writer.kernel_ident(kernel)
        self.decls: dict[str, BufferDecl] = {d.name: d for d in writer.program.globals}
        self.parents: dict[str, str] = {}
        for node in walk(kernel.body):
            if isinstance(node, Alloc):
                self.decls[node.buffer.name] = node.buffer
            elif isinstance(node, Load):
                self.parents[node.dst] = node.src
            elif isinstance(node, Store):
                self.parents[node.src] = node.dst
        self.innermost = writer.hw.memories[-1].name
        self.root = writer.hw.root_memory.name
        self.vector = kernel_vector(kernel, writer.workload)
        self.extents = writer.program.extents[kernel.name]
        self.loop_extents: dict[str, int] = {}
        self.locals: dict[str, Local] = {}
        self.accumulators: dict[str, str] = {}  # local -> its vector accumulators
        self.pending: set[str] = set()  # locals whose accumulators are not folded yet
        self.transposed: dict[str, str] = {}  # streamed local -> its copy with j last
        self.heap: list[str] = []  # root partials to free at the end
        # register tiles each of whose vectors several of a compute's points read: an
        # operand without one of the compute's dims, which its tile walks (a GEMM's B
        # under a register tile of several rows)
        self.reused = {buffer for n in walk(kernel.body) if isinstance(n, Compute)
                       for tensor, buffer in n.operands.items()
                       if any(extent > 1 and d not in _indexing(writer.workload, n, tensor)
                              for d, extent in zip(n.dims, n.tile, strict=True))}
        self.in_parallel = False
        self.region = False  # inside the kernel's one parallel region (`one_region`)
        # the operands' cache tiles packed into panels (synth.emit.c_pack)
        self.packs: dict[str, Pack] = {} if online_kernel(kernel) else plan_packs(
            kernel, writer.workload, writer.hw, self.decls, self.parents, self.vector)
        self.packer = PackWriter(self)

    @property
    def lanes(self) -> int:
        return self.w.lanes

    def var(self, name: str) -> str:
        return self.w.names(f"var:{self.kernel.name}:{name}", name)

    def render(self) -> Code:
        code = Code()
        stmts = ", ".join(self.kernel.statements)
        vector = f", vectorised along {self.vector}" if self.vector else ""
        code.comment(f"kernel {self.kernel.name}: statements {stmts}{vector}")
        linkage = "static " if self.w.only is None else ""  # called from synth_run.c
        with code.function(f"{linkage}void {self.ident}({self.w.signature()})"):
            self.packer.storage(code)
            units = parallel_units(self.kernel)
            if units > 1 and one_region(self.kernel.body, self.root, self.innermost,
                                        self.packs):
                # the partial results' storage first (shared by the threads), then one
                # parallel region: its parallel loops share their iterations out
                heap = [n for n in self.kernel.body
                        if isinstance(n, Alloc) and n.buffer.memory == self.root]
                self.nodes(code, heap)
                code(f"#pragma omp parallel num_threads({units})")
                self.region = True
                with code.block(""):
                    self.nodes(code, [n for n in self.kernel.body if n not in heap])
                self.region = False
            else:
                self.nodes(code, self.kernel.body)
            for name in self.heap:
                code(f"free({name});")
        return code

    # -- nodes -------------------------------------------------------------------

    def nodes(self, code: Code, nodes: Sequence[Node]) -> None:
        for node in nodes:
            if isinstance(node, Loop):
                self.loop(code, node)
            elif isinstance(node, Alloc):
                self.alloc(code, node.buffer)
            elif isinstance(node, Load):
                self.transfer(code, node.dst, node.src, load=True)
            elif isinstance(node, Store):
                self.transfer(code, node.src, node.dst, load=False)
            elif isinstance(node, Fill):
                self.fill(code, node)
            elif isinstance(node, Compute):
                self.compute(code, node)
            elif isinstance(node, Running | Rescale):
                online_node(self, code, node)
            elif isinstance(node, OnlineCombine):  # its units never split the pass
                raise EmitError(f"the C emitter does not merge partial running statistics "
                                f"(of {node.running}); online.split keeps a CPU's pass whole")
            else:
                self.combine(code, node)

    def loop(self, code: Code, loop: Loop) -> None:
        if loop.var.kind is LoopKind.SEQUENTIAL:
            self.loop_extents[loop.var.name] = loop.var.extent
            unroll = self.unroll(loop)
            if unroll > 1:
                self.unrolled(code, loop, unroll)
                return
            with self.w.for_loop(code, self.var(loop.var.name), loop.var.extent,
                                 f"{loop.var.where}: {loop.var.symbol}"):
                self.nodes(code, loop.body)
            return
        if self.in_parallel:
            raise EmitError(f"{self.w.emitter_name}: kernel {self.kernel.name} has a parallel "
                            f"loop {loop.var.name} inside another parallel loop's body")
        chain = [loop]
        while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop) \
                and chain[-1].body[0].var.kind is LoopKind.PARALLEL:
            chain.append(chain[-1].body[0])
        units = math.prod(lp.var.extent for lp in chain)
        collapse = f" collapse({len(chain)})" if len(chain) > 1 else ""
        if self.region:  # inside the kernel's region: its threads share the iterations
            code(f"#pragma omp for{collapse} schedule(static)")
        else:
            code(f"#pragma omp parallel for{collapse} num_threads({units}) schedule(static)")
        self.in_parallel = True
        self.parallel_chain(code, chain)
        self.in_parallel = False

    def unroll(self, loop: Loop) -> int:
        """Iterations of a loop over tiles along the vector dimension, with no loop along
        another dimension inside, to unroll: up to `UNROLL_VECTORS` vectors per iteration
        of it, a divisor of its extent (1: as it is). The loops inside unroll on their own
        (a loop over 2 one-vector tiles folded after each pair: the pair's loop is unrolled
        whole and the loop around it by 2). And the innermost loop over the steps of a
        reduction (`reduction_unroll`)."""
        var = loop.var
        if var.dim != self.vector:
            return self.reduction_unroll(loop)
        if var.step % self.lanes or any(
                isinstance(node, Loop) and node.var.dim != self.vector
                for node in walk(loop.body)):
            return 1
        return _divisor(var.extent, UNROLL_VECTORS // (var.step // self.lanes))

    def reduction_unroll(self, loop: Loop) -> int:
        """Iterations of the innermost loop around a register tile (no loop inside it)
        along a dimension every statement inside reduces, to unroll: up to
        `UNROLL_STEPS` steps of the reduction per iteration (the register tile's own
        included), a divisor of its extent. Each of its steps updates the same
        accumulators: its counter, branch and addresses take the place in the
        out-of-order window of the next tiles' updates. fa6's QK^T with one FMA per step
        of a loop of 64 ran 2.6 cycles a step, 1.5 with the steps unrolled by 8
        (RESULTS.md, "Chains through memory")."""
        body = list(walk(loop.body))
        computes = [node for node in body if isinstance(node, Compute)]
        innermost = all(isinstance(node, Alloc | Load | Store | Fill | Compute) for node in body)
        reduces = all(loop.var.dim in self.w.workload.statement(node.statement).reduced
                      for node in computes)
        if not (computes and innermost and reduces):
            return 1
        return _divisor(loop.var.extent, UNROLL_STEPS // loop.var.step)

    def unrolled(self, code: Code, loop: Loop, unroll: int) -> None:
        """`loop` as a loop over groups of `unroll` iterations around a loop over one
        group that the compiler unrolls completely (`#pragma GCC unroll` on the whole loop
        was not honoured where its body folds a reduction: gcc's unroller passed it by)."""
        name = self.var(loop.var.name)
        group = self.w.names(f"unroll:{self.kernel.name}:{loop.var.name}", f"{name}_u")
        index = self.w.index_type
        with code.block(f"for ({index} {group} = 0; {group} < {loop.var.extent}; "
                        f"{group} += {unroll})", f"{loop.var.where}: {loop.var.symbol}"):
            code(f"#pragma GCC unroll {unroll}")
            with code.block(f"for ({index} {name} = {group}; {name} < {group} + {unroll}; "
                            f"{name}++)"):
                self.nodes(code, loop.body)

    def parallel_chain(self, code: Code, chain: list[Loop]) -> None:
        loop, *rest = chain
        self.loop_extents[loop.var.name] = loop.var.extent
        with self.w.for_loop(code, self.var(loop.var.name), loop.var.extent,
                             f"{loop.var.where}: {loop.var.symbol}"):
            if rest:
                self.parallel_chain(code, rest)
            else:
                self.nodes(code, loop.body)

    def alloc(self, code: Code, decl: BufferDecl) -> None:
        ctype = self.w.ctype(decl.dtype)
        if decl.memory == self.root:  # partial results of a split reduction
            name = self.w.names(f"buf:{self.kernel.name}:{decl.name}", decl.name)
            size = self.partial_count(decl) * math.prod(decl.shape)
            nbytes = padded(decl.dtype.itemsize * size)
            code(f"{ctype} *{name} = aligned_alloc({ALIGN}, {nbytes}); "
                 f"/* {describe(decl)} */")
            code(f"if (!{name}) abort();")
            self.heap.append(name)
            return
        if decl.name in self.packs:
            self.packer.alloc(code, self.packs[decl.name])
            return
        if decl.memory != self.innermost:
            code.comment(f"{describe(decl)}: blocked for, not copied")
            return
        local = self.local(decl)
        self.locals[decl.name] = local
        vectors = local.vector is not None or local.splat
        if local.size * (self.w.vb if vectors else decl.dtype.itemsize) > MAX_LOCAL_BYTES:
            raise EmitError(f"{self.w.emitter_name}: tile {decl.name} of kernel "
                            f"{self.kernel.name} exceeds {MAX_LOCAL_BYTES} bytes")
        element = f"v{VECTOR_TYPES[decl.dtype][0]}" if vectors else ctype
        code(f"{element} {local.name}[{local.size}]; /* {describe(decl)} */")
        accumulators = self.accumulator_count(decl)
        if accumulators:
            acc = self.w.names(f"acc:{self.kernel.name}:{decl.name}", f"{decl.name}_acc")
            self.accumulators[decl.name] = acc
            code(f"v{VECTOR_TYPES[decl.dtype][0]} {acc}[{accumulators}]; "
                 f"/* vector partial results of the reductions over {self.vector} */")

    def local(self, decl: BufferDecl) -> Local:
        name = self.w.names(f"buf:{self.kernel.name}:{decl.name}", decl.name)
        vector = self.vector
        along = (vector is not None and vector in decl.dims and decl.dtype in VECTOR_TYPES
                 and decl.shape[decl.dims.index(vector)] % self.lanes == 0)
        splat = (vector is not None and vector not in decl.dims
                 and decl.dtype in VECTOR_TYPES and decl.name in self.broadcast_operands())
        return Local(decl, name, vector if along else None, self.lanes, splat)

    def broadcast_operands(self) -> set[str]:
        """Innermost tiles that vectorised computes only read (never a compute's target,
        never stored): those without the vector dimension are kept broadcast."""
        read: set[str] = set()
        written: set[str] = set()
        for node in walk(self.kernel.body):
            if isinstance(node, Compute):
                written.add(node.out)
                stmt = self.w.workload.statement(node.statement)
                if self.vectorised(stmt, node.dims, node.tile):
                    read.update(node.operands.values())
            elif isinstance(node, Store | Fill):
                written.add(node.src if isinstance(node, Store) else node.buffer)
        return read - written

    def accumulator_count(self, decl: BufferDecl) -> int:
        """Vector accumulators for a target reduced over the vector dimension by a
        vectorised statement: one per vector of the compute tile along that dimension,
        per element of the target's tile."""
        counts = [tile[dims.index(self.vector)] // self.lanes
                  for stmt, dims, tile in self.computes_into(decl.name)
                  if self.vector not in stmt.indices and self.vectorised(stmt, dims, tile)]
        return max(counts, default=0) * math.prod(decl.shape)

    def computes_into(self, buffer: str) -> Iterator[tuple[Statement, tuple[str, ...],
                                                          tuple[int, ...]]]:
        for node in walk(self.kernel.body):
            if isinstance(node, Compute) and node.out == buffer:
                yield self.w.workload.statement(node.statement), node.dims, node.tile

    def vectorised(self, stmt: Statement, dims: Sequence[str], tile: Sequence[int]) -> bool:
        """A statement runs in vector arithmetic when it iterates the kernel's vector
        dimension over whole vectors and its arithmetic has a vector form."""
        dtypes = {n: t.dtype for n, t in self.w.workload.tensors.items()}
        return (self.vector is not None and self.vector in dims
                and tile[list(dims).index(self.vector)] % self.lanes == 0
                and vectorisable(stmt, dtypes))

    def partial_count(self, decl: BufferDecl) -> int:
        return math.prod(self.loop_extent(v) for v in decl.partial_loops)

    def loop_extent(self, name: str) -> int:
        for node in walk(self.kernel.body):
            if isinstance(node, Loop) and node.var.name == name:
                return node.var.extent
        raise EmitError(f"kernel {self.kernel.name}: no loop {name}")

    # -- addresses ---------------------------------------------------------------

    def root_of(self, buffer: str) -> BufferDecl:
        """The root-memory array a view (a cache tile) lives in."""
        decl = self.decls[buffer]
        while decl.memory != self.root:
            if decl.name not in self.parents:
                raise EmitError(f"{self.w.emitter_name}: buffer {decl.name} of kernel "
                                f"{self.kernel.name} is neither loaded nor stored; it needs "
                                f"storage of its own")
            decl = self.decls[self.parents[decl.name]]
        return decl

    def root_name(self, decl: BufferDecl) -> str:
        if decl.name in self.w.tensor_names and not decl.partial_loops:
            return self.w.tensor_names[decl.name]
        return self.w.names(f"buf:{self.kernel.name}:{decl.name}", decl.name)

    def address(self, root: BufferDecl, index: Sequence[str]) -> str:
        """`root[...]` at global element `index` (one C expression per tensor axis)."""
        tensor = self.w.workload.tensors[root.tensor]
        flat = ""
        for expr, extent in zip(index, tensor.shape, strict=True):
            flat = expr if not flat else f"({flat}) * {extent} + {expr}"
        flat = flat or "0"
        if root.partial_loops:
            part = ""
            for var in root.partial_loops:
                ext = self.loop_extent(var)
                part = self.var(var) if not part else f"({part}) * {ext} + {self.var(var)}"
            flat = f"({part}) * {math.prod(tensor.shape)} + {flat}"
        return f"{self.root_name(root)}[{flat}]"

    def affine(self, value: Affine) -> str:
        return self.w.affine(value, self.var).code

    def full(self, dims: Sequence[str], origin: Sequence[Affine], tile: Sequence[int]
             ) -> str | None:
        """The C condition that a tile lies inside the tensor along `dims`, or None when
        it always does."""
        checks = []
        for dim, start, size in zip(dims, origin, tile, strict=True):
            if start.max_value(self.loop_extents) + size > self.extents[dim]:
                checks.append(f"{self.affine(start)} + {size} <= {self.extents[dim]}")
        return " && ".join(checks) or None

    @contextmanager
    def tile_loops(self, code: Code, dims: Sequence[str], tile: Sequence[int],
                   bound: Mapping[str, str] | None = None) -> Iterator[dict[str, str]]:
        """Nested loops over a tile's offsets (constant bounds, or `bound` where given),
        yielding dim -> the offset's C name."""
        names = {d: self.w.names(f"tile:{d}:{len(code.lines)}", f"t_{d}") for d in dims}
        with _nested(code, [(names[d], (bound or {}).get(d, str(n)))
                            for d, n in zip(dims, tile, strict=True)], self.w.index_type):
            yield names

    # -- transfers between the innermost tiles and the tensors ---------------------

    def transfer(self, code: Code, local_name: str, other: str, load: bool) -> None:
        local = self.locals.get(local_name)
        if local is None:
            if load and local_name in self.packs:
                self.packer.copy_in(code, self.packs[local_name])
            return  # between views: the caches move the lines
        if not load and local_name in self.pending:
            self.fold(code, local_name)
        if load and online_streams(self, local_name):  # read where it lies (c_online)
            online_pretranspose(self, code, local_name)
            return
        root = self.root_of(other)
        decl = local.decl
        full = self.full(decl.dims, decl.origin, decl.shape)
        if full is not None:
            with code.block(f"if ({full})"):
                self.copy(code, local, root, load, vector=True)
            with code.block("else"):
                self.copy(code, local, root, load, vector=False)
        else:
            self.copy(code, local, root, load, vector=True)
        if load and local_name in self.accumulators:
            self.reset(code, local_name, local.decl)

    def copy(self, code: Code, local: Local, root: BufferDecl, load: bool, vector: bool
             ) -> None:
        decl = local.decl
        pack = self.packer.source(decl.name) if load else None
        if vector and local.vector:
            dims = list(decl.dims)
            shape = [n // self.lanes if d == local.vector else n
                     for d, n in zip(decl.dims, decl.shape, strict=True)]
            with self.tile_loops(code, dims, shape) as at:
                offsets = {d: f"{at[d]} * {self.lanes}" if d == local.vector else at[d]
                           for d in dims}
                element = self.element(decl, root, pack, offsets)
                slot = f"{local.name}[{local.slot(at)}]"
                suffix = VECTOR_TYPES[decl.dtype][0]
                last = pack.free[-1] if pack is not None else dims[-1]
                if last == local.vector:  # contiguous: one vector load or store
                    if load:  # a vector several points read kept in its register
                        kind = "vload_kept" if decl.name in self.reused else "vload"
                        code(f"{slot} = {kind}_{suffix}(&{element});")
                    else:
                        code(f"vstore_{suffix}(&{element}, {slot});")
                elif load:  # strided along the vector dimension: gathered (synth_vec.h)
                    lane = dict(offsets)
                    lane[local.vector] = f"{at[local.vector]} * {self.lanes} + 1"
                    second = self.element(decl, root, pack, lane)
                    code(f"{slot} = vgather_{suffix}(&{element}, "
                         f"(int64_t)(&{second} - &{element}));")
                else:  # strided along the vector dimension: lane by lane
                    lane = dict(offsets)
                    lane[local.vector] = f"{at[local.vector]} * {self.lanes} + l_"
                    lane_element = self.element(decl, root, pack, lane)
                    with self.w.for_loop(code, "l_", self.lanes):
                        code(f"{lane_element} = {slot}[l_];")
            return
        bounds = self.bounds(decl.dims, decl.origin, decl.shape)
        with self.tile_loops(code, decl.dims, decl.shape, bounds) as at:
            element = self.element(decl, root, pack, at)
            mine = local.scalar(at)
            if local.splat and load:
                suffix = VECTOR_TYPES[decl.dtype][0]
                code(f"{local.name}[{local.slot(at)}] = vsplat_{suffix}({element});")
            else:
                code(f"{mine} = {element};" if load else f"{element} = {mine};")

    def element(self, decl: BufferDecl, root: BufferDecl, pack: Pack | None,
                offsets: Mapping[str, str]) -> str:
        """The element of `decl`'s tile at `offsets` (dim -> C expression) where it is
        read from: the tensor, or the packed tile it is loaded from."""
        if pack is None:
            index = [self.offset(decl, i, offsets[d]) for i, d in enumerate(decl.dims)]
            return self.address(root, index)
        if decl.dims != pack.decl.dims:
            raise EmitError(f"{self.w.emitter_name}: tile {decl.name} of kernel "
                            f"{self.kernel.name} is read from the packed tile "
                            f"{pack.decl.name} along other dimensions")
        start = {d: decl.origin[i] - pack.decl.origin[i] for i, d in enumerate(decl.dims)}
        return f"{self.packer.name(pack)}[{pack.index(start, offsets, self.affine)}]"

    def offset(self, decl: BufferDecl, axis: int, local: str) -> str:
        start = decl.origin[axis]
        return local if start == Affine() else f"{self.affine(start)} + {local}"

    def bounds(self, dims: Sequence[str], origin: Sequence[Affine], tile: Sequence[int]
               ) -> dict[str, str]:
        """Loop bounds that stop at the tensor's edge, where a tile may cross it."""
        out = {}
        for dim, start, size in zip(dims, origin, tile, strict=True):
            if start.max_value(self.loop_extents) + size > self.extents[dim]:
                out[dim] = (f"({self.extents[dim]} - ({self.affine(start)}) < {size} ? "
                            f"{self.extents[dim]} - ({self.affine(start)}) : {size})")
        return out

    # -- fills, combines ---------------------------------------------------------

    def fill(self, code: Code, node: Fill) -> None:
        decl = self.decls[node.buffer]
        value = self.w.fill_value(node.value, decl.dtype)
        local = self.locals.get(node.buffer)
        if local is not None:
            splat = (f"vsplat_{VECTOR_TYPES[decl.dtype][0]}({value})"
                     if local.vector or local.splat else value)
            with self.w.for_loop(code, "k_", local.size):
                code(f"{local.name}[k_] = {splat};")
            if node.buffer in self.accumulators:
                self.reset(code, node.buffer, decl)
            return
        if decl.memory != self.root:
            raise EmitError(f"{self.w.emitter_name}: kernel {self.kernel.name} fills the "
                            f"cache tile {decl.name}, which has no storage of its own")
        if node.buffer in self.w.unread:
            code.comment(f"{decl.name} = {value} is never read (its values live in "
                         f"registers): not written")
            return
        size = self.partial_count(decl) * math.prod(decl.shape)
        name = self.root_name(decl)
        units = parallel_units(self.kernel)
        if self.region:  # shared out among the region's threads (a barrier after it)
            code(f"#pragma omp for{' simd' if size > 1 << 16 else ''} schedule(static)")
        elif size > 1 << 16 and units > 1:  # on the kernel's threads (one: no region)
            code(f"#pragma omp parallel for simd num_threads({units}) schedule(static)")
        elif size > 1 << 16:
            code("#pragma omp simd")
        with self.w.for_loop(code, "k_", size):
            code(f"{name}[k_] = {value};")

    def combine(self, code: Code, node: Combine) -> None:
        """target op= the partial results, one per split unit (after the kernel's loops)."""
        target, partials = self.decls[node.target], self.decls[node.partials]
        if target.memory != self.root or partials.memory != self.root:
            raise EmitError(f"{self.w.emitter_name}: kernel {self.kernel.name} combines "
                            f"partial results on the device, which CPUs do not do")
        size = math.prod(target.shape)
        parts = self.partial_count(partials)
        real = "float" if target.dtype.is_float else "int"
        acc = Typed(f"{self.root_name(target)}[k_]", target.dtype.is_float)
        part = Typed(f"{self.root_name(partials)}[p_ * {size} + k_]", target.dtype.is_float)
        step = self.w.reduce_step(node.op, acc, part, real)
        if self.region:  # elements shared out among the region's threads
            code("#pragma omp for schedule(static)")
        with self.w.for_loop(code, "k_", size), self.w.for_loop(code, "p_", parts):
            code(f"{acc.code} = {self.w.cast(step, target.dtype)};")

    # -- computes ----------------------------------------------------------------

    def compute(self, code: Code, node: Compute) -> None:
        stmt = self.w.workload.statement(node.statement)
        for tensor in stmt.inputs:
            name = node.operands[tensor]
            if name in self.pending:
                self.fold(code, name)
        self.check_origins(node)
        code.comment(statement_text(stmt.target, stmt.indices, stmt.op, stmt.expr)
                     + f" over {' x '.join(map(str, node.tile))}")
        if online_compute(self, code, node, stmt):  # an online step's own vectors
            return
        if not self.vectorised(stmt, node.dims, node.tile):
            self.scalar_compute(code, node, stmt)
            return
        full = self.full(node.dims, node.origin, node.tile)
        if full is None:
            self.vector_compute(code, node, stmt)
            return
        with code.block(f"if ({full})"):
            self.vector_compute(code, node, stmt)
        with code.block("else"):
            self.scalar_compute(code, node, stmt)

    def check_origins(self, node: Compute) -> None:
        """Every tile a compute touches starts where the compute does (the materialiser's
        rule for the innermost memory), so tile offsets are the compute's offsets."""
        origin = dict(zip(node.dims, node.origin, strict=True))
        for name in (node.out, *node.operands.values()):
            decl = self.decls[name]
            if name not in self.locals or any(
                    start != origin[d] for d, start in zip(decl.dims, decl.origin, strict=True)):
                raise EmitError(f"{self.w.emitter_name}: compute {node.statement} of kernel "
                                f"{self.kernel.name} reads {name}, which is not an innermost "
                                f"tile starting where the compute does")

    def vector_compute(self, code: Code, node: Compute, stmt: Statement) -> None:
        """Explicit SIMD over the tile: reduced dimensions outermost (independent
        accumulators next to each other), then the target's, vector chunks innermost."""
        assert self.vector is not None
        target = self.locals[node.out]
        order = [d for d in node.dims if d in stmt.reduced and d != self.vector] + \
                [d for d in node.dims if d in stmt.indices and d != self.vector] + [self.vector]
        tile = dict(zip(node.dims, node.tile, strict=True))
        shape = [tile[d] // self.lanes if d == self.vector else tile[d] for d in order]
        suffix = VECTOR_TYPES[stmt.dtype][0]
        with self.tile_loops(code, order, shape) as at:
            value = self.w.vector_expr(stmt.expr, lambda a: self.vector_access(node, a, at),
                                       suffix)
            if self.vector in stmt.indices:
                slot = f"{target.name}[{target.slot(at)}]"
            else:  # reduced over the vector dimension: into the vector accumulators
                acc = self.accumulators[node.out]
                chunks = tile[self.vector] // self.lanes
                slot = f"{acc}[({target.slot(at) if target.decl.dims else '0'}) * " \
                       f"{chunks} + {at[self.vector]}]"
                self.pending.add(node.out)
            code(f"{slot} = {self.w.vector_step(stmt.op, slot, value, suffix)};")

    def vector_access(self, node: Compute, access: Access, at: Mapping[str, str]
                      ) -> tuple[str, bool]:
        """An operand in vector code: (C text, whether it is a vector)."""
        local = self.locals[node.operands[access.tensor]]
        index = {d: at[d] for d in access.indices}
        if (local.vector is not None and local.vector in access.indices) or local.splat:
            return f"{local.name}[{local.slot(index)}]", True
        return local.scalar(index), False

    def scalar_compute(self, code: Code, node: Compute, stmt: Statement) -> None:
        """Element by element, stopping at the tensor's edge."""
        target = self.locals[node.out]
        bounds = self.bounds(node.dims, node.origin, node.tile)
        real = "float" if stmt.dtype.is_float else "double"
        tensors = self.w.workload.tensors
        with self.tile_loops(code, node.dims, node.tile, bounds) as at:
            def access(a: Access) -> str:
                return self.locals[node.operands[a.tensor]].scalar({d: at[d]
                                                                    for d in a.indices})
            value = self.w.expr(stmt.expr, access, tensors, real)
            mine = target.scalar({d: at[d] for d in stmt.indices})
            acc = Typed(mine, stmt.dtype.is_float)
            step = self.w.reduce_step(stmt.op, acc, value, real)
            code(f"{mine} = {self.w.cast(step, stmt.dtype)};")

    def reset(self, code: Code, buffer: str, decl: BufferDecl) -> None:
        acc = self.accumulators[buffer]
        op = self.reducing_op(buffer)
        identity = self.w.fill_value(op.identity(decl.dtype), decl.dtype)
        count = self.accumulator_count(decl)
        with self.w.for_loop(code, "k_", count):
            code(f"{acc}[k_] = vsplat_{VECTOR_TYPES[decl.dtype][0]}({identity});")

    def reducing_op(self, buffer: str) -> ReduceOp:
        ops = {stmt.op for stmt, _, _ in self.computes_into(buffer) if stmt.op.reduces}
        if len(ops) != 1:
            raise EmitError(f"{self.w.emitter_name}: kernel {self.kernel.name} reduces into "
                            f"{buffer} with {len(ops)} operators")
        return ops.pop()

    def fold(self, code: Code, buffer: str) -> None:
        """The vector accumulators of `buffer`, folded into its elements (and reset)."""
        local = self.locals[buffer]
        decl = local.decl
        op = self.reducing_op(buffer)
        acc = self.accumulators[buffer]
        elements = math.prod(decl.shape)
        chunks = self.accumulator_count(decl) // elements
        suffix = VECTOR_TYPES[decl.dtype][0]
        real = "float" if decl.dtype.is_float else "int"
        horizontal = {ReduceOp.ADD: "vsum", ReduceOp.MUL: "vprod", ReduceOp.MAX: "vhmax",
                      ReduceOp.MIN: "vhmin"}[op]
        code.comment(f"fold the vector partial results of {decl.name}")
        with self.w.for_loop(code, "e_", elements):
            code(f"v{suffix} v_ = {acc}[e_ * {chunks}];")
            with self.w.for_loop(code, "c_", chunks, start=1):
                code(f"v_ = {self.w.vector_step(op, 'v_', f'{acc}[e_ * {chunks} + c_]', suffix)};")
            mine = local.scalar({d: f"e_ / {_inner(decl, i)} % {n}" for i, (d, n) in
                                 enumerate(zip(decl.dims, decl.shape, strict=True))})
            step = self.w.reduce_step(op, Typed(mine, decl.dtype.is_float),
                                      Typed(f"{horizontal}_{suffix}(v_)", decl.dtype.is_float),
                                      real)
            code(f"{mine} = {self.w.cast(step, decl.dtype)};")
        self.reset(code, buffer, decl)
        self.pending.discard(buffer)


def online_node(kw: KernelWriter, code: Code, node: Running | Rescale) -> None:
    from synth.emit import c_online  # the online rewrite's nodes (its own module)
    if isinstance(node, Running):
        c_online.running(kw, code, node)
    else:
        c_online.rescale(kw, code, node)


def online_kernel(kernel: Kernel) -> bool:
    """An online kernel's step copies its operands into arrays of its own (`c_online`):
    no packing (which would copy the cache tiles again every pass)."""
    from synth.ir.online import is_online
    return is_online(kernel)


def online_streams(kw: KernelWriter, buffer: str) -> bool:
    from synth.emit import c_online  # the online rewrite's statements (its own module)
    return c_online.streams(kw, buffer)


def online_pretranspose(kw: KernelWriter, code: Code, buffer: str) -> None:
    from synth.emit import c_online  # the online rewrite's statements (its own module)
    c_online.pretranspose(kw, code, buffer)


def online_compute(kw: KernelWriter, code: Code, node: Compute, stmt: Statement) -> bool:
    from synth.emit import c_online  # the online rewrite's statements (its own module)
    return c_online.compute(kw, code, node, stmt)


def _inner(decl: BufferDecl, axis: int) -> int:
    """Elements per step of `axis` in a row-major tile."""
    return math.prod(decl.shape[axis + 1:])


@contextmanager
def _nested(code: Code, loops: Sequence[tuple[str, str]], index_type: str) -> Iterator[None]:
    if not loops:
        yield
        return
    (name, bound), *rest = loops
    with code.block(f"for ({index_type} {name} = 0; {name} < {bound}; {name}++)"), \
            _nested(code, rest, index_type):
        yield


def _accesses(expr: Expr) -> list[Access]:
    return [n for n in expr_nodes(expr) if isinstance(n, Access)]


def describe(decl: BufferDecl) -> str:
    shape = "x".join(map(str, decl.shape)) or "scalar"
    return f"{decl.memory} tile of {decl.tensor} [{shape}]"
