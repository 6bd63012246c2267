"""A read-only Tabulator that ignores data echoed back by the browser.

Our tables are never edited in the browser (``disabled=True``), yet the front end can still sync its copy
of the data back. When that echo crosses a server-side replacement of ``value`` (an event just brought a
new row), Panel writes the stale columns into the new frame and fails with "Must have equal len keys and
value". The server is the only writer of these tables, so the echo carries nothing and is dropped.
"""

from __future__ import annotations

from typing import Any

import panel as pn


class ReadOnlyTable(pn.widgets.Tabulator):
    def __init__(self, value: Any = None, **params: Any) -> None:
        params.setdefault("disabled", True)
        params.setdefault("show_index", False)
        super().__init__(value, **params)

    def _process_data(self, data: Any) -> None:
        return None
