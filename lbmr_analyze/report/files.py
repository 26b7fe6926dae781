"""The result tables as files: Parquet, CSV and JSON, each written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path


def replace(path: Path, data: bytes | str) -> None:
    """Write atomically (so a re-run never leaves a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8", "newline": ""})) as f:
        f.write(data)
    os.replace(tmp, path)


def as_text(v) -> str | None:
    """A value as the report spells it: ``true``/``false`` for booleans (as CSV and
    JSON do), None stays None."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _arrow(rows: list[dict]):
    """The table as Arrow (columns typed from the values; a column mixing types,
    like the summary's values, as text)."""
    import pyarrow as pa
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.Table.from_pylist([{k: as_text(v) for k, v in r.items()} for r in rows])


def write_tables(out: Path, tables: dict[str, list[dict]]) -> None:
    """``out/<name>.parquet``, ``out/<name>.csv`` (RFC 4180: header row, text quoted,
    ``true``/``false``, empty cell for null) and ``out/<name>.json`` (a list of
    objects) for every table, each written atomically.  Parquet and CSV come from
    one Arrow table (pyarrow's writers: a storm's 400,000 per-context rows took
    seconds through Python's csv and json modules)."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    for name, rows in tables.items():
        t = _arrow(rows)
        tmp = out / f"{name}.parquet.tmp"
        pq.write_table(t, tmp)
        os.replace(tmp, out / f"{name}.parquet")
        if t.num_columns:
            tmp = out / f"{name}.csv.tmp"
            pacsv.write_csv(t, str(tmp), pacsv.WriteOptions(quoting_style="needed"))
            os.replace(tmp, out / f"{name}.csv")
        else:
            replace(out / f"{name}.csv", "\n")
        replace(out / f"{name}.json", json.dumps(rows, default=str) + "\n")
