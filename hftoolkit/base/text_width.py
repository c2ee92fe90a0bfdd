"""Text cut to a width: paths that keep their last folder names, and tables of one line a row (the console's
run tables, the HTML report's cells)."""

from __future__ import annotations

import re


def short_path(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: a path keeps its last whole folder names after '…/' (or the end of
    the last, if that alone is too long), another text its start and its end around '…' (a run's label is its
    recipe's name, then the keys that tell it from its namesakes); the whole text stays in the run directory,
    the report and --json."""
    if len(text) <= limit:
        return text
    parts = [p for p in re.split(r"(?<=/)", text) if p]
    kept = ""
    for part in reversed(parts):
        if len("…/" + part + kept) > limit:
            break
        kept = part + kept
    if "/" in text:  # a path's end tells it from the others; its last name alone too long: that name's end
        return "…/" + kept.lstrip("/") if kept else "…" + text[-max(limit - 1, 1):]
    head = max((limit - 1) // 3, 1)
    return text[:head] + "…" + text[len(text) - max(limit - 1 - head, 0):]


def fit_rows(rows: list[dict[str, str]], width: int, drop: tuple[str, ...], shorten: tuple[str, ...]
             ) -> list[dict[str, str]]:
    """Rows whose table fits `width` columns with one line a row: the cells of `shorten` (paths, names) cut to
    40 characters, then the columns of `drop` left out in that order, then those cells cut to 32 and 24."""
    def needed(table: list[dict[str, str]]) -> int:
        return sum(max(len(k), *(len(r[k]) for r in table)) + 3 for k in table[0]) + 1

    if not rows:
        return rows
    def cut(limit: int, columns) -> list[dict[str, str]]:
        return [{k: short_path(v, limit) if k in shorten else v for k, v in r.items() if k in columns}
                for r in rows]

    columns = list(rows[0])
    table = cut(40, columns)
    for column in drop:  # a column left out before a name is cut below 40
        if needed(table) <= width or len(columns) <= 2:
            break
        if column not in columns:  # (a column some tables have)
            continue
        columns.remove(column)
        table = cut(40, columns)
    for limit in (32, 24):
        if needed(table) <= width:
            break
        table = cut(limit, columns)
    return table
