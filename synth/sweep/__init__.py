"""`synth sweep`: workloads x sizes x hardware models x overrides x constraint variants x
solvers, one pipeline run per point, with tables, plots and an HTML page (docs/sweep.md).

    spec.py      the axes, from a TOML spec file or from flags (`Spec`)
    points.py    the axes expanded into points, every one checked before any runs (`Point`)
    task.py      one point's run (`pipeline.run`) as a JSON-ready result; what workers run
    store.py     finished points on disk under their key (resume), the rows, CSV and JSON lines
    execute.py   local worker processes or a Dask cluster, results as they finish
    plots.py     the plots (matplotlib), html.py the page that shows them and the table
    command.py   what `synth sweep` does, from the flags to the exit code

matplotlib and distributed are imported only inside this package's functions that need
them, and this package only by `synth sweep`, so the rest of synth starts without them.
"""
