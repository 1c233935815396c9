"""One column of a small text table (CSV, TSV, `;`-separated, whitespace, or one value per line).

Shared by every command that takes a column of the user's text files (price series, label files).
"""
from __future__ import annotations

import csv

from .errors import BadInputError


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def read_column(text: str, source: str, column: str | int | None = None,
                tab: bool = False) -> tuple[list[str], list[int]]:
    """Return (values, line numbers) of one column of `text`, stripped strings in file order.

    A leading UTF-8 byte-order mark is dropped. Blank lines and lines starting with `#` are skipped. The
    delimiter is a tab (or `tab=True`), else `,`, else `;`, else whitespace. The first row is a header when
    `column` is a name, or when every cell of it is non-numeric while the next row has a number (so a
    headerless file with a text column such as dates keeps its first row). `column` is a header name or an
    index (negative counts from the end); default: the last column. Errors name `source`, the column or the
    line at fault.
    """
    if text.startswith("\ufeff"):  # a UTF-8 byte-order mark (Excel, Notepad) is not part of the first value
        text = text[1:]
    numbered = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    if not numbered:
        raise BadInputError(f"{source}: no values (empty input)")
    first = numbered[0][1]
    delim = "\t" if (tab or "\t" in first) else "," if "," in first else ";" if ";" in first else None
    lines = [ln for _, ln in numbered]
    rows = list(csv.reader(lines, delimiter=delim)) if delim else [ln.split() for ln in lines]
    lineno = [n for n, _ in numbered]
    key = None if column is None else str(column)
    by_name = key is not None and not key.lstrip("-").isdigit()
    header = None
    if len(rows) > 1 and (by_name or (all(not _is_number(c) for c in rows[0]) and any(_is_number(c) for c in rows[1]))):
        header, rows, lineno = [c.strip() for c in rows[0]], rows[1:], lineno[1:]
    width = len(rows[0])
    if key is None:
        col = width - 1
    elif not by_name:
        col = int(key)
        if not -width <= col < width:
            raise BadInputError(f"{source}: column {col} out of range (the file has {width} columns)")
    else:
        if header is None or key not in header:
            raise BadInputError(f"{source}: no column named {key!r}" + (f" (columns: {', '.join(header)})" if header else ""))
        col = header.index(key)
    values = []
    for n, row in zip(lineno, rows):
        if not -len(row) <= col < len(row):
            raise BadInputError(f"{source}: line {n} has {len(row)} column(s), need column {col}")
        values.append(row[col].strip())
    return values, lineno
