"""The sweep's plots (matplotlib, each as PNG and SVG), one panel per workload:

    time_vs_size   modelled time against problem size, log-log, one line per series
    breakdown      each point's modelled time split into its parts (shares, stacked)
    solve_time     solve time against problem size, log-log, one line per series
    ratio          modelled time over the baseline's at the same point (a hardware
                   configuration or a solver: `points.baseline`), when there is one

A series is a hardware configuration (the model with its overrides), with the variant and
the solver when the sweep has several of them; lines of one model share a colour. The
problem size is the one size that varies across a workload's points, or else the product
of its sizes. `plots.json` records, for every plot, its files and each panel's series as
drawn (the labelled lines read back from the axes before saving).

matplotlib is imported here only (`Figure` without pyplot: no global state, no GUI).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth.cli import format_seconds
from synth.sweep.points import Baseline
from synth.sweep.store import write_atomically

Row = Mapping[str, Any]

FORMATS = ("png", "svg")
SIDECAR = "plots.json"
PANEL_IN = (5.0, 3.6)  # inches per panel: a legible log-log plot with a legend
MARGINS_IN = (0.85, 0.15, 0.55, 0.35)  # left, right, bottom, top of a panel: ticks, labels
TITLE_IN = 0.4  # above the panels: the plot's title
SUPTITLE_IN = 0.1  # from the top edge to the title
BAR_IN = 0.22  # inches per bar of the breakdown: one line of 7-point tick labels
BAR_HALF = 0.4  # half a bar's thickness, in bars (a fifth of the pitch stays blank)
BREAKDOWN_BAR_IN = 5.0  # the width of the breakdown's bars (the share axis)
LABEL_CHAR_IN = 0.055  # the width of a character of a 7-point tick label (DejaVu Sans)
LEGEND_IN = 2.1  # right of the breakdown's bars: the legend of its parts
LEGEND_GAP = 1.06  # where the legend starts, in bar widths: clear of the 100% label
PANEL_LEGEND_MAX = 4  # series a panel's own legend lists; more: one legend below them all
LEGEND_ROW_IN = 0.2  # a row of the legend below the panels (7-point labels)
LEGEND_PAD_IN = 0.25  # around it
LEGEND_HANDLE_IN = 0.8  # a legend entry besides its label: the line, the gaps
PANEL_FRAME_IN = 1.0  # a breakdown panel's height besides its bars: title, share axis
PANEL_BOTTOM_IN = 0.6  # of which below the bars: the share axis and its label
MAX_BARS = 60  # bars per workload in the breakdown: more do not fit a readable panel
MAX_COLUMNS = 3  # panels per row
MAX_TICKS = 7  # labelled ticks on a size axis: more overlap in a panel's width
STYLES = ("-", "--", ":", "-.")


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    files: tuple[Path, ...]
    panels: tuple[dict[str, Any], ...]  # per panel: title, series (labels), points


# ---------------------------------------------------------------- series


def _several(rows: Sequence[Row], key: str) -> bool:
    return len({r[key] for r in rows}) > 1


def series_of(rows: Sequence[Row]) -> Callable[[Row], str]:
    """A row's series label: its configuration, with variant and solver when they vary."""
    variants, solvers = _several(rows, "variant"), _several(rows, "solver")

    def label(row: Row) -> str:
        parts = [str(row["config"])]
        if variants:
            parts.append(str(row["variant"]))
        if solvers:
            parts.append(str(row["solver"]))
        return " · ".join(parts)

    return label


def x_axis(rows: Sequence[Row]) -> tuple[str, Callable[[Row], int]]:
    """The problem size of a workload's rows: the size that varies, or the product."""
    names = list(rows[0]["sizes"]) if rows else []
    varying = [n for n in names if len({r["sizes"][n] for r in rows}) > 1]
    if len(varying) == 1:
        name = varying[0]
        return name, lambda row: int(row["sizes"][name])
    return ("·".join(names) or "size"), lambda row: int(row["size"])


def by_workload(rows: Sequence[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(str(row["workload"]), []).append(row)
    return groups


class Styles:
    """Colours by hardware model, line styles by the other series of the model."""

    def __init__(self, rows: Sequence[Row]) -> None:
        """The styles of every series of `rows`, whichever rows a plot then draws."""
        self.models = list(dict.fromkeys(str(r["hardware"]) for r in rows))
        self.seen: dict[str, list[str]] = {}
        label = series_of(rows)
        for row in rows:
            self(str(row["hardware"]), label(row))

    def __call__(self, model: str, label: str) -> dict[str, Any]:
        labels = self.seen.setdefault(model, [])
        if label not in labels:
            labels.append(label)
        index = self.models.index(model) if model in self.models else 0
        return {"color": f"C{index % 10}",
                "linestyle": STYLES[labels.index(label) % len(STYLES)], "marker": "o",
                "markersize": 3}


# ---------------------------------------------------------------- figures


def _figure(panels: int, legend_in: float = 0.0) -> tuple[Any, list[Any]]:
    """A grid of `panels` panels of `PANEL_IN`, with fixed margins in inches (matplotlib's
    constrained layout found the same margins at a third of a plot's drawing time), and
    `legend_in` inches below them for a legend."""
    from matplotlib.figure import Figure

    columns = max(1, min(MAX_COLUMNS, panels))
    rows = max(1, math.ceil(panels / columns))
    width, height = PANEL_IN[0] * columns, PANEL_IN[1] * rows + TITLE_IN + legend_in
    figure = Figure(figsize=(width, height))
    left, right, bottom, top = MARGINS_IN
    bottom += legend_in
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                           top=1 - (top + TITLE_IN) / height,
                           wspace=(left + right) / (PANEL_IN[0] - left - right),
                           hspace=(top + bottom) / (PANEL_IN[1] - top - bottom))
    axes = list(figure.subplots(rows, columns, squeeze=False).flat)
    for unused in axes[panels:]:
        unused.set_visible(False)
    return figure, axes[:panels]


def _panel(ax: Any) -> dict[str, Any]:
    """A panel as drawn: its title and the labels of its series (lines or bars)."""
    lines = [line.get_label() for line in ax.get_lines()
             if not line.get_label().startswith("_")]
    bars = [c.get_label() for c in ax.collections if not c.get_label().startswith("_")]
    return {"title": ax.get_title(), "series": lines or bars,
            "points": sum(len(line.get_xdata()) for line in ax.get_lines()
                          if not line.get_label().startswith("_"))}


SVG_FONTTYPE = "none"
"""Text in the SVG files as text, not as glyph outlines: searchable and selectable in a
browser, and a third of the size."""


def _save(figure: Any, out: Path, name: str, title: str, axes: Sequence[Any]) -> Plot:
    from matplotlib import rc_context

    figure.suptitle(title, y=1 - SUPTITLE_IN / figure.get_figheight())
    panels = tuple(_panel(ax) for ax in axes)
    files = []
    for fmt in FORMATS:
        path = out / f"{name}.{fmt}"
        with rc_context({"svg.fonttype": SVG_FONTTYPE}):
            figure.savefig(path, format=fmt)
        files.append(path)
    return Plot(name, title, tuple(files), panels)


def _lines(ax: Any, rows: Sequence[Row], value: Callable[[Row], float | None],
           styles: Styles, label: Callable[[Row], str]) -> None:
    """One line per series of `rows`, points sorted by problem size; log-log."""
    name, size = x_axis(rows)
    series: dict[str, list[tuple[int, float]]] = {}
    models: dict[str, str] = {}
    for row in rows:
        y = value(row)
        if y is not None and y > 0:
            series.setdefault(label(row), []).append((size(row), y))
            models[label(row)] = str(row["hardware"])
    for text, points in series.items():
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, label=text, **styles(models[text], text))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"problem size ({name})")
    ax.grid(True, which="major", alpha=0.3)


BINARY = (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def binary(value: float) -> str:
    """A size tick: `4Ki` for 4096, `1Mi` for 2^20, `96` for 96."""
    for suffix, scale in BINARY:
        if value >= scale and value % scale == 0:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


MINOR_LABELLED = (2, 5)  # the minor ticks labelled on an axis with one decade or less


def _log_ticks(ax: Any, unit: str | None) -> None:
    """Plain-text tick labels on log axes (`64k`, `1 ms`): matplotlib's default labels
    are mathtext (`$10^{3}$`), which took most of the time of drawing a plot. Sizes get
    powers of two; a value axis with fewer than two powers of ten in its range also
    labels its minor ticks at 2 and 5 times a power of ten (only those: all eight
    overlap)."""
    from matplotlib.ticker import EngFormatter, FuncFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=MAX_TICKS))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: binary(value)))
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    formatter = EngFormatter(unit=unit) if unit else plain
    low, high = ax.get_ylim()
    ax.yaxis.set_major_formatter(formatter)
    decades = math.floor(math.log10(high)) - math.ceil(math.log10(low)) + 1
    if decades >= 2:
        ax.yaxis.set_minor_formatter(NullFormatter())
        return

    def minor(value: float, position: int | None) -> str:
        mantissa = round(value / 10 ** math.floor(math.log10(value) + 1e-9))
        return formatter(value, position) if mantissa in MINOR_LABELLED else ""

    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def size_plot(out: Path, rows: Sequence[Row], name: str, title: str, ylabel: str,
              value: Callable[[Row], float | None], styles: Styles,
              label: Callable[[Row], str] | None = None, level: float | None = None
              ) -> Plot:
    """Per workload, `value` against problem size, one line per series (`label`, by
    default `series_of(rows)`), and a grey horizontal line at `level` (not a series)."""
    groups = by_workload(rows)
    label = label or series_of(rows)
    labels = list(dict.fromkeys(label(r) for r in rows if (value(r) or 0) > 0))
    shared = len(labels) > PANEL_LEGEND_MAX
    columns = _legend_columns(labels, min(MAX_COLUMNS, len(groups)) * PANEL_IN[0])
    legend_in = (LEGEND_ROW_IN * math.ceil(len(labels) / columns) + LEGEND_PAD_IN
                 if shared else 0.0)
    figure, axes = _figure(len(groups), legend_in)
    for ax, (workload, group) in zip(axes, groups.items(), strict=True):
        _lines(ax, group, value, styles, label)
        if level is not None:
            ax.axhline(level, color="grey", linewidth=0.8, label="_level")
        if ax.get_lines() and not shared:
            ax.legend(fontsize=7)
        _log_ticks(ax, "s" if level is None else None)
        ax.set_title(workload)
        ax.set_ylabel(ylabel)
    if shared:
        handles = {h.get_label(): h for ax in reversed(axes) for h in ax.get_lines()}
        figure.legend([handles[t] for t in labels if t in handles],
                      [t for t in labels if t in handles], loc="lower center",
                      ncols=columns, fontsize=7, frameon=False,
                      bbox_to_anchor=(0.5, LEGEND_PAD_IN / 2 / figure.get_figheight()))
    return _save(figure, out, name, title, axes)


def _legend_columns(labels: Sequence[str], width_in: float) -> int:
    """How many of `labels` fit side by side in `width_in` (a figure's legend)."""
    longest = max((len(t) for t in labels), default=1)
    return max(1, min(len(labels), int(width_in // (LABEL_CHAR_IN * longest
                                                     + LEGEND_HANDLE_IN))))


def _breakdown_groups(rows: Sequence[Row]) -> tuple[dict[str, list[Row]], list[str]]:
    """The solved rows per workload (at most `MAX_BARS`, evenly spaced) and the parts,
    largest in total first."""
    groups = {w: [r for r in g if r.get("breakdown_s") and r.get("cost_s")]
              for w, g in by_workload(rows).items()}
    groups = {w: g[::math.ceil(len(g) / MAX_BARS)] for w, g in groups.items() if g}
    totals: dict[str, float] = {}
    for row in (r for g in groups.values() for r in g):
        for part, seconds in row["breakdown_s"].items():
            totals[part] = totals.get(part, 0.0) + seconds / row["cost_s"]
    return groups, sorted(totals, key=lambda part: -totals[part])


def breakdown_plot(out: Path, rows: Sequence[Row]) -> Plot:
    """Per workload, one horizontal bar per solved point: the shares of its parts (the
    parts of that workload's points only), the total time in its label."""
    from matplotlib.figure import Figure

    groups, parts = _breakdown_groups(rows)
    label = series_of(rows)
    names = {w: [" ".join(f"{k}={v}" for k, v in r["sizes"].items())
                 + f" · {label(r)} ({format_seconds(r['cost_s'])})" for r in g]
             for w, g in groups.items()}
    longest = max((len(n) for labels in names.values() for n in labels), default=10)
    left_in = LABEL_CHAR_IN * longest + 0.3
    width = left_in + BREAKDOWN_BAR_IN + LEGEND_IN
    heights = [PANEL_FRAME_IN + BAR_IN * len(g) for g in groups.values()]
    height = sum(heights) + TITLE_IN
    figure = Figure(figsize=(width, height))
    axes, top = [], height - TITLE_IN
    for panel_height in heights:
        bottom = top - panel_height + PANEL_BOTTOM_IN
        axes.append(figure.add_axes((left_in / width, bottom / height,
                                     BREAKDOWN_BAR_IN / width,
                                     (panel_height - PANEL_FRAME_IN) / height)))
        top -= panel_height
    for ax, (workload, group) in zip(axes, groups.items(), strict=True):
        _stack(ax, names[workload], group, parts)
        ax.set_title(workload)
    return _save(figure, out, "breakdown", "Modelled time by part", axes)


def _stack(ax: Any, names: Sequence[str], group: Sequence[Row], parts: Sequence[str]
           ) -> None:
    """One bar per row, its parts' shares stacked: one collection of rectangles per part
    (a `barh` per part made one artist per rectangle, and drew ten times slower)."""
    from matplotlib.collections import PolyCollection
    from matplotlib.ticker import PercentFormatter

    left = [0.0] * len(group)
    for index, part in enumerate(parts):
        shares = [r["breakdown_s"].get(part, 0.0) / r["cost_s"] for r in group]
        boxes = [((x, y - BAR_HALF), (x + w, y - BAR_HALF), (x + w, y + BAR_HALF),
                  (x, y + BAR_HALF)) for y, (x, w) in enumerate(zip(left, shares,
                                                                     strict=True)) if w > 0]
        if boxes:  # a part none of these points has: no bars, no legend entry
            ax.add_collection(PolyCollection(boxes, facecolors=f"C{index % 10}",
                                             label=part))
            left = [a + b for a, b in zip(left, shares, strict=True)]
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)  # the first point on top
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("share of the modelled time")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(LEGEND_GAP, 1))


def ratio_plot(out: Path, rows: Sequence[Row], base: Baseline, styles: Styles) -> Plot:
    """Per workload, each series' modelled time over the baseline's at the same point."""
    def match(row: Row) -> tuple[Any, ...]:
        other = row["solver"] if base.kind == "hw" else row["config"]
        return (row["workload"], tuple(row["sizes"].items()), row["variant"], other)

    own = "config" if base.kind == "hw" else "solver"
    reference = {match(r): r["cost_s"] for r in rows
                 if r[own] == base.name and r.get("cost_s")}
    others = [r for r in rows if r[own] != base.name]

    def ratio(row: Row) -> float | None:
        at = reference.get(match(row))
        return row["cost_s"] / at if at and row.get("cost_s") else None

    return size_plot(out, others, "ratio", f"Modelled time relative to {base.name}",
                     f"time / time with {base.name}", ratio, styles, series_of(rows),
                     level=1.0)


PLOTS = ("time_vs_size", "breakdown", "solve_time", "ratio")


def draw(name: str, out: Path, rows: Sequence[Row], base: Baseline | None) -> Plot:
    """One of `PLOTS` into `out` (a module-level function: worker processes draw them)."""
    styles = Styles(rows)  # the same colour for a model in every plot
    if name == "time_vs_size":
        return size_plot(out, rows, name, "Modelled time", "modelled time [s]",
                         lambda r: r.get("cost_s"), styles)
    if name == "solve_time":
        return size_plot(out, rows, name, "Solve time", "solve time [s]",
                         lambda r: r.get("solve_s"), styles)
    if name == "breakdown":
        return breakdown_plot(out, rows)
    assert name == "ratio" and base is not None
    return ratio_plot(out, rows, base, styles)


Mapper = Callable[..., Iterator[Plot]]


def draw_all(out: Path, rows: Sequence[Row], base: Baseline | None,
             mapper: Mapper = map) -> list[Plot]:
    """Every plot of the sweep into `out` (each by `draw`, through `mapper`: `map`, or
    a process pool's), and `plots.json` describing them. The ratio plot needs a
    baseline and a solved point."""
    names = [n for n in PLOTS if n != "ratio"
             or (base is not None and any(r.get("cost_s") for r in rows))]
    count = len(names)
    plots = list(mapper(draw, names, [out] * count, [rows] * count, [base] * count))
    write_atomically(out / SIDECAR, json.dumps({"plots": [
        {"name": p.name, "title": p.title, "files": [f.name for f in p.files],
         "panels": list(p.panels)} for p in plots]}, indent=1))
    return plots
