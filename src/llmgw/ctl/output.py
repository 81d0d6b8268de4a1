"""How a table leaves ctl: `-o table | wide | tsv | json`.

- `table`: rich, sized to the terminal; long cells end in an ellipsis. The
  default in a terminal.
- `wide`: every cell whole, columns aligned with spaces, one line per row, no
  colour. The default when output is not a terminal, so `ctl replicas | grep`
  sees whole names.
- `tsv`: a header line, then one line per row, cells separated by tabs (tabs
  and newlines inside a cell become spaces).
- `json`: the controller's wire value (the `--json` shapes in docs/ctl.md).

The table builders (tables.py) make one rich Table; wide and tsv read the
plain text of its cells, so every format shows the same cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "wide", "tsv", "json")

# The longest table rich lays out. It measures every cell of every column, about a
# millisecond a row: `ctl replicas` in a terminal sat for minutes on a fleet of 100k
# replicas. A longer table is printed as `wide`, which is aligned too and takes a
# fraction of that.
TABLE_MAX_ROWS = 1000


def choose(requested: str | None, *, json_flag: bool, is_terminal: bool) -> str:
    """The format to use: an explicit -o wins, then --json, then terminal or not."""
    if requested is not None:
        return requested
    if json_flag:
        return "json"
    return "table" if is_terminal else "wide"


def _plain(cell: object) -> str:
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return " ".join(text.split())


def rows(table: Table) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a rich Table, as plain one-line strings."""
    headers = [_plain(c.header) for c in table.columns]
    columns = [[_plain(cell) for cell in c.cells] for c in table.columns]
    return headers, [list(r) for r in zip(*columns, strict=True)] if columns else []


def wide(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    # Widths in terminal cells, not characters: an emoji or a CJK name takes two, and
    # counted as one it pushed every later column of its row out of line.
    widths = [max(cell_len(h), *(cell_len(r[i]) for r in body)) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *body]:
        cells = [c + " " * (w - cell_len(c)) for c, w in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def tsv(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    return "".join("\t".join(row) + "\n" for row in [list(headers), *body])


def fit(fmt: str, table: Table, err: TextIO) -> str:
    """`fmt`, but `wide` for a `table` longer than TABLE_MAX_ROWS (said on `err`)."""
    if fmt != "table" or table.row_count <= TABLE_MAX_ROWS:
        return fmt
    err.write(
        f"{table.row_count:,} rows: printed as -o wide (a table is laid out for at most "
        f"{TABLE_MAX_ROWS:,})\n"
    )
    return "wide"


def write_table(out: TextIO, table: Table, fmt: str) -> None:
    """wide or tsv (table and json are the caller's: they need rich or the wire value)."""
    headers, body = rows(table)
    out.write(wide(headers, body) if fmt == "wide" else tsv(headers, body))
