"""Code emitters, one per target, sharing one C-style renderer (see docs/architecture.md).

- `cstyle`: what C-like targets share (names, types, literals, the workload's
  expressions with reference semantics, affine indices, blocks and loops).
- `upmem`: `emit_upmem` writes a host program and one DPU program per kernel for the UPMEM
  SDK, a Makefile, and the data to check them; `check_upmem` runs `make check`, which
  builds them against the host-side stand-in for the UPMEM runtime in `upmem_runtime/`
  and compares the outputs with the reference.
- `c`: C11 with OpenMP for this machine's cores (`c_check` builds, checks and times it).
- `mlir`: upstream MLIR, verified and run through torch-mlir's tools (`mlir_check`).
- `ttlang`: tt-lang kernels for Tenstorrent, run on its functional simulator
  (`ttlang_check`).

`targets` is the one table of them (name -> emit, check, JSON).
"""
