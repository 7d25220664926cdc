"""CSV cells that a spreadsheet shows as written, never runs.

A cell whose text starts with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return before one) is a live
formula when Excel, LibreOffice or Google Sheets open the file (CSV injection: OWASP's "CSV Injection" page); a
model named ``=HYPERLINK(...)`` would become one. Such text is written behind a single quote, the character
spreadsheets read as "this cell is text"; numbers, negative ones included, and a lone character (the ``-`` of "no plan") are written as they are. Every CSV
nestplan writes (a comparison's, a sweep's results.csv) writes its cells through :func:`csv_cell`.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
TEXT_MARK = "'"  # what spreadsheets read as "the rest is text"


def csv_cell(value: object) -> object:
    """``value`` as a CSV cell: text a spreadsheet would run as a formula behind a single quote, the rest as is."""
    if isinstance(value, str) and len(value) > 1 and value.startswith(FORMULA_STARTS) and not _is_number(value):
        return TEXT_MARK + value
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
