"""Hypothesis strategies: random small workloads, as `.syn` text.

A workload is a chain of 1-4 statements over 1-3 loop dimensions with small extents
(1..24: primes, odd and non-dividing sizes included), elementwise maps and reductions
(`+=`, `max=`, `min=`, fresh or accumulating onto an earlier target), in f32 or i32.

Values stay finite and exact comparisons stay meaningful by construction: every term
carries a bound on its magnitude (inputs are in [-1, 1) for floats and [1, 3] for
integers, see `synth.reference.make_inputs`), and a term that would exceed the dtype's
budget is replaced by a tamer one (a product by a sum, a sum-reduction by a max). `exp`
only sees small arguments, `log` and `sqrt` only `1 + |x|` and `|x|`, and every divisor is
`2 + |x|` (floats) or an input element (integers, never zero), so nothing divides by zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

DIMS = ("i", "j", "k")
SIZE_OF = {"i": "NI", "j": "NJ", "k": "NK"}
# Magnitude budgets: f32 values stay where a reordered reduction is still accurate to the
# reference's tolerance; i32 values stay far from overflow (wrap-around is exact in both
# the reference and the interpreter for + and *, but not once max/min/division see it).
BUDGET = {"f32": 1e4, "i32": 2**20}
INPUT_BOUND = {"f32": 1.0, "i32": 3.0}
# extent 1 stays possible (integers) but rare: a workload of only 1s has no decisions
EXTENTS = st.one_of(st.sampled_from([2, 3, 5, 7, 8, 11, 13, 16, 17, 23, 24]),
                    st.integers(1, 24))


@dataclass(frozen=True)
class Leaf:
    tensor: str
    indices: tuple[str, ...]
    bound: float
    is_input: bool


@dataclass(frozen=True)
class Term:
    text: str
    indices: tuple[str, ...]  # in order of first appearance
    bound: float


def _merge(*parts: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(i for p in parts for i in p))


@dataclass
class GeneratedWorkload:
    """A generated workload: its text and what it was built from (for messages)."""

    text: str
    dtype: str
    extents: dict[str, int]
    statements: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # hypothesis prints the falsifying example with this
        return f"GeneratedWorkload(\n{self.text})"


@st.composite
def terms(draw: st.DrawFn, leaves: list[Leaf], dtype: str, depth: int) -> Term:
    """An expression over `leaves` whose magnitude stays within the dtype's budget."""
    budget = BUDGET[dtype]
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        leaf = draw(st.sampled_from(leaves))
        return Term(f"{leaf.tensor}[{', '.join(leaf.indices)}]", leaf.indices, leaf.bound)
    kinds = ["+", "-", "*", "max", "min", "neg", "abs", "relu", "div"]
    if dtype == "f32":
        kinds += ["exp", "tanh", "sqrt", "log", "recip", "const"]
    kind = draw(st.sampled_from(kinds))
    a = draw(terms(leaves, dtype, depth - 1))
    if kind in ("+", "-", "*", "max", "min"):
        b = draw(terms(leaves, dtype, depth - 1))
        idx = _merge(a.indices, b.indices)
        if kind == "*" and a.bound * b.bound <= budget:
            return Term(f"({a.text} * {b.text})", idx, a.bound * b.bound)
        if kind in ("max", "min"):
            return Term(f"{kind}({a.text}, {b.text})", idx, max(a.bound, b.bound))
        op = "-" if kind == "-" else "+"
        return Term(f"({a.text} {op} {b.text})", idx, a.bound + b.bound)
    if kind == "neg":
        return Term(f"(-{a.text})", a.indices, a.bound)
    if kind in ("abs", "relu", "tanh"):
        return Term(f"{kind}({a.text})", a.indices, 1.0 if kind == "tanh" else a.bound)
    if kind == "div":
        if dtype == "i32":  # an input element: 1..3, never zero
            inputs = [leaf for leaf in leaves if leaf.is_input]
            d = draw(st.sampled_from(inputs))
            return Term(f"({a.text} / {d.tensor}[{', '.join(d.indices)}])",
                        _merge(a.indices, d.indices), a.bound)
        b = draw(terms(leaves, dtype, depth - 1))
        return Term(f"({a.text} / (2 + abs({b.text})))", _merge(a.indices, b.indices),
                    a.bound / 2)
    if kind == "exp":
        if a.bound > 4:
            return Term(f"tanh({a.text})", a.indices, 1.0)
        return Term(f"exp({a.text})", a.indices, 2.72 ** a.bound)
    if kind == "sqrt":
        return Term(f"sqrt(abs({a.text}))", a.indices, a.bound ** 0.5 + 1)
    if kind == "log":
        return Term(f"log(1 + abs({a.text}))", a.indices, a.bound)
    if kind == "recip":
        return Term(f"recip(2 + abs({a.text}))", a.indices, 0.5)
    value = draw(st.sampled_from(["0.5", "2", "-1.5", "3.0"]))
    return Term(f"({a.text} * {value})", a.indices, a.bound * abs(float(value)))


@st.composite
def workloads(draw: st.DrawFn, dtype: str | None = None, max_statements: int = 4,
              extents: st.SearchStrategy[int] = EXTENTS) -> GeneratedWorkload:
    """A random small workload as `.syn` text (see the module docstring)."""
    dtype = dtype or draw(st.sampled_from(["f32", "i32"]))
    ndims = draw(st.integers(1, 3))
    dims = DIMS[:ndims]
    sizes = {d: draw(extents) for d in dims}
    lines = [f"size {SIZE_OF[d]} = {sizes[d]}" for d in dims]

    leaves: list[Leaf] = []
    for n in range(draw(st.integers(1, 3))):
        scalar = n > 0 and draw(st.integers(0, 5)) == 0  # a rank-0 input, sometimes
        rank = 0 if scalar else draw(st.integers(1, ndims))
        indices = tuple(draw(st.permutations(dims))[:rank])
        name = f"x{n}"
        shape = ", ".join(SIZE_OF[d] for d in indices)
        lines.append(f"in {name} : {dtype}[{shape}]")
        leaves.append(Leaf(name, indices, INPUT_BOUND[dtype], True))

    targets: dict[str, Leaf] = {}  # statement targets so far
    body: list[str] = []
    count = draw(st.integers(1, max_statements))
    for n in range(count):
        onto = None  # accumulate onto an earlier target (it may not read itself then)
        if targets and draw(st.integers(0, 3)) == 0:
            onto = draw(st.sampled_from(sorted(targets)))
        usable = [leaf for leaf in leaves if leaf.tensor != onto]
        term = draw(terms(usable or leaves, dtype, depth=2))
        right = term.indices
        if onto is not None and onto not in term.text \
                and set(targets[onto].indices) <= set(right):
            name, indices = onto, targets[onto].indices
            op = draw(st.sampled_from(["+=", "max=", "min="]))
        else:
            name = f"t{n}"
            op = draw(st.sampled_from(["=", "+=", "max=", "min="]))
            if op == "=":
                indices = tuple(draw(st.permutations(right)))
            else:  # mostly a real reduction: keep fewer indices than the right uses
                most = len(right) if draw(st.integers(0, 7)) == 0 else max(len(right) - 1, 0)
                keep = draw(st.lists(st.sampled_from(right), unique=True, max_size=most)) \
                    if right else []
                indices = tuple(keep)
        reduced = [d for d in right if d not in indices]
        if op != "=" and not reduced and name not in targets and draw(st.integers(0, 7)):
            op = "="  # a fresh reduction over nothing: legal, but mostly not that

        volume = 1
        for d in reduced:
            volume *= sizes[d]
        previous = targets[name].bound if name in targets else 0.0
        bound = term.bound * (volume if op == "+=" else 1) + (previous if op == "+=" else 0)
        if bound > BUDGET[dtype]:
            op, bound = "max=", max(term.bound, previous)
        body.append(f"{name}[{', '.join(indices)}] {op} {term.text}")
        bound = max(bound, previous)
        targets[name] = Leaf(name, indices, bound, False)
        leaves = [leaf for leaf in leaves if leaf.tensor != name]
        leaves.append(targets[name])

    last = body[-1].split("[", 1)[0]
    for name, target in targets.items():
        if name == last or draw(st.booleans()):
            shape = ", ".join(SIZE_OF[d] for d in target.indices)
            lines.append(f"out {name} : {dtype}[{shape}]")
    text = "\n".join(lines + body) + "\n"
    return GeneratedWorkload(text, dtype, sizes, body)
