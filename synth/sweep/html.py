"""`index.html`: one static page that shows the sweep: a summary, the plots (their SVG
files, linked to the PNG ones), and a table with one row per point. It needs no server
and no script: open it from DIR in a browser. Every text from the sweep is escaped.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from synth.cli import format_seconds
from synth.sweep.plots import Plot
from synth.sweep.points import Baseline
from synth.sweep.store import CSV_NAME, JSONL_NAME, write_atomically

Row = Mapping[str, Any]
INDEX = "index.html"
PARTS_SHOWN = 3  # the largest parts of a point's cost the table names

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
figure { display: inline-block; margin: 0 1em 1em 0; vertical-align: top; }
figure img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.2em 0.6em; text-align: left;
         vertical-align: top; }
th { position: sticky; top: 0; background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.optimal { color: #176117; } .feasible { color: #6b5d00; }
.infeasible, .timeout { color: #8a4b00; } .error { color: #a00000; font-weight: bold; }
"""

COLUMNS = ("#", "workload", "sizes", "hardware", "variant", "solver", "status", "cost",
           "largest parts", "solve", "gap", "counts", "kernels", "validation", "note")


def _seconds(value: Any) -> str:
    return format_seconds(float(value)) if isinstance(value, int | float) else "-"


def _pairs(value: Mapping[str, Any] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (value or {}).items()) or "-"


def _parts(row: Row) -> str:
    parts = row.get("breakdown_s") or {}
    total = row.get("cost_s") or 0
    largest = sorted(parts.items(), key=lambda item: -item[1])[:PARTS_SHOWN]
    return ", ".join(f"{name} {value / total:.0%}" for name, value in largest
                     if total and value) or "-"


def _note(row: Row) -> str:
    if row.get("error"):
        return str(row["error"])
    if row.get("conflict") is not None:
        return "conflict: " + (", ".join(row["conflict"]) or "(every candidate)")
    if row.get("binding") is not None:
        return "binding: " + (", ".join(row["binding"]) or "none")
    return ""


def _validation(row: Row) -> str:
    checks = []
    if row.get("validation") is not None:
        checks.append("passed" if row["validation"] else "FAILED")
    emitted = row.get("emitted")
    if emitted and emitted.get("passed") is not None:
        checks.append(f"{emitted['target']}: {'passed' if emitted['passed'] else 'FAILED'}")
    return ", ".join(checks) or "-"


def _cells(row: Row) -> list[tuple[str, str]]:
    """(text, class) per column."""
    gap = row.get("gap")
    return [(str(row["index"]), "num"), (str(row["workload"]), ""),
            (_pairs(row.get("sizes")), ""), (str(row["config"]), ""),
            (str(row["variant"]), ""), (str(row["solver"]), ""),
            (str(row["status"]), str(row["status"])), (_seconds(row.get("cost_s")), "num"),
            (_parts(row), ""), (_seconds(row.get("solve_s")), "num"),
            (f"{gap:.2%}" if isinstance(gap, int | float) else "-", "num"),
            (_pairs(row.get("counts")), ""), (" ".join(row.get("kernels") or []) or "-", ""),
            (_validation(row), ""), (_note(row), "")]


def table(rows: Sequence[Row]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = []
    for row in rows:
        cells = "".join(f'<td class="{css}">{html.escape(text)}</td>' if css else
                        f"<td>{html.escape(text)}</td>" for text, css in _cells(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + \
        "\n</tbody>\n</table>"


def figures(plots: Sequence[Plot]) -> str:
    blocks = []
    for plot in plots:
        files = {f.suffix.lstrip("."): f.name for f in plot.files}
        image, link = files.get("svg", files.get("png", "")), files.get("png", "")
        blocks.append(f'<figure><a href="{html.escape(link)}"><img src="{html.escape(image)}"'
                      f' alt="{html.escape(plot.title)}"></a>'
                      f"<figcaption>{html.escape(plot.title)}</figcaption></figure>")
    return "\n".join(blocks)


def write_index(out: Path, title: str, rows: Sequence[Row], plots: Sequence[Plot],
                total: int, base: Baseline | None) -> Path:
    """`out/index.html` for the rows and plots; its path."""
    statuses = Counter(str(r["status"]) for r in rows)
    counts = ", ".join(f"{n} {status}" for status, n in statuses.most_common()) or "none"
    compared = f"; ratios relative to {base.name}" if base is not None else ""
    page = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>{len(rows)} of {total} points: {html.escape(counts)}{html.escape(compared)}.
Data: <a href="{CSV_NAME}">{CSV_NAME}</a>, <a href="{JSONL_NAME}">{JSONL_NAME}</a>.</p>
<h2>Plots</h2>
{figures(plots)}
<h2>Points</h2>
{table(rows)}
</body>
</html>
"""
    path = out / INDEX
    write_atomically(path, page)
    return path
