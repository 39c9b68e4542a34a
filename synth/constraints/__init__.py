"""The schedule space as constraints: the term language, the encoding and cost model,
and the solver backends that lower the one description (CP-SAT, exhaustive)."""
