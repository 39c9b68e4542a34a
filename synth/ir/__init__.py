"""The loop-nest IR: nodes, materialisation from a solution, printer, verifier and the
NumPy interpreter that validates a schedule."""
