"""Finished points on disk, and the sweep's rows as `results.csv` and `results.jsonl`.

`Store` keeps one file per finished point, `DIR/points/<key>.json` (the point and its
result), written to a temporary file and renamed over: a point is either stored whole or
not at all, so an interrupted sweep loses only the points it was running. A rerun of the
same sweep finds each point's file by its key (`synth.sweep.points`) and runs only the
points without one (all of them with `--force`).

A row is a point (`Point.to_json`) with its result (`synth.sweep.task.result`) and
whether it came from the store. `results.jsonl` has one row per line as it is; in
`results.csv` nested values are spread over columns: `size.N`, `hw.<key>` (overrides),
`count.<symbol>` (R, D, T, ...) and `cost.<part>` (seconds), after the fixed columns.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from synth.sweep.points import Point

POINTS_DIR = "points"
CSV_NAME = "results.csv"
JSONL_NAME = "results.jsonl"


class Store:
    """The finished points of the sweeps written into one directory."""

    def __init__(self, out: Path) -> None:
        self.dir = out / POINTS_DIR  # created by the first `save`

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        """The stored result of the point with this key; None when there is none (or
        the file is not one this store wrote)."""
        try:
            data = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        result = data.get("result")
        return result if isinstance(result, dict) else None

    def save(self, point: Point, result: Mapping[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path(point.key), json.dumps(
            {"key": point.key, "point": point.to_json(), "result": result},
            allow_nan=False, indent=1))


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all (a temporary file renamed over it)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------- rows


def problem_size(sizes: Mapping[str, int]) -> int:
    """The x axis of the plots: the product of the workload's sizes."""
    return math.prod(sizes.values())


def row(point: Point, result: Mapping[str, Any], from_store: bool) -> dict[str, Any]:
    data = {**point.to_json(), **result, "from_store": from_store}
    data["size"] = problem_size(data["sizes"])
    return data


HEAD = ("index", "workload", "sizes", "size", "hardware", "config", "hw_set", "variant",
        "solver", "status", "cost_s", "cost_ps", "gap", "solve_s", "wall_s", "kernels",
        "variables", "binding", "conflict", "validation", "emitted", "error", "from_store", "key")
SPREAD = {"sizes": "size.", "counts": "count.", "breakdown_s": "cost."}


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return " ".join(map(str, value))
    return value


def csv_record(data: Mapping[str, Any]) -> dict[str, Any]:
    """A row as CSV cells: the fixed columns, then the spread ones."""
    record = {key: _cell(data.get(key)) for key in HEAD}
    emitted = data.get("emitted")
    record["emitted"] = _cell(emitted and emitted.get("passed"))
    for setting in data.get("hw_set") or []:
        key, _, value = setting.partition("=")
        record[f"hw.{key}"] = value
    for key, prefix in SPREAD.items():
        for name, value in (data.get(key) or {}).items():
            record[f"{prefix}{name}"] = value
    return record


class Stream:
    """`results.jsonl` while the sweep runs: the rows it has when it starts (stored
    points), then each row as its point finishes, in the order they finish (`tail -f`
    shows the sweep). `write_tables` rewrites it in the sweep's order at the end."""

    def __init__(self, out: Path, rows: Sequence[Mapping[str, Any]]) -> None:
        write_atomically(out / JSONL_NAME, "".join(_line(r) for r in rows))
        self.file = (out / JSONL_NAME).open("a", encoding="utf-8")

    def add(self, row: Mapping[str, Any]) -> None:
        self.file.write(_line(row))
        self.file.flush()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def _line(row: Mapping[str, Any]) -> str:
    return json.dumps(row, allow_nan=False) + "\n"


def write_tables(out: Path, rows: Sequence[Mapping[str, Any]]) -> list[Path]:
    """`results.jsonl` and `results.csv` of the rows; the paths written."""
    jsonl = out / JSONL_NAME
    write_atomically(jsonl, "".join(_line(r) for r in rows))
    records = [csv_record(r) for r in rows]
    spread = sorted({k for r in records for k in r} - set(HEAD))
    columns = [*HEAD, *spread]
    table = out / CSV_NAME
    with tempfile.NamedTemporaryFile("w", dir=out, prefix=f".{CSV_NAME}.", delete=False,
                                     newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, columns, restval="")
        writer.writeheader()
        writer.writerows(records)
    os.replace(handle.name, table)
    return [table, jsonl]
