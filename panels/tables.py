"""A read-only Tabulator that ignores data echoed back by the browser, and the hints tables share.

Our tables are never edited in the browser (``disabled=True``), yet the front end can still sync its copy
of the data back. When that echo crosses a server-side replacement of ``value`` (an event just brought a
new row), Panel writes the stale columns into the new frame and fails with "Must have equal len keys and
value". The server is the only writer of these tables, so the echo carries nothing and is dropped.
"""

from __future__ import annotations

from typing import Any

import panel as pn

from services.auth import Principal, Role


class ReadOnlyTable(pn.widgets.Tabulator):
    """``empty``: what the table will hold and how to fill it, shown in place of rows while there are none."""

    def __init__(self, value: Any = None, *, empty: str = "Nothing here yet.", **params: Any) -> None:
        params.setdefault("disabled", True)
        params.setdefault("show_index", False)
        params.setdefault("configuration", {"placeholder": empty})
        super().__init__(value, **params)

    def _process_data(self, data: Any) -> None:
        return None


def role_hint(principal: Principal, needed: Role, what: str) -> pn.pane.Markdown:
    """Say why an action is greyed out (empty and hidden when the principal may act)."""
    allowed = principal.allows(needed)
    text = "" if allowed else (f"{what} needs the {needed.value} role; you are signed in as "
                               f"{principal.role.value}. Ask an admin for a token with that role.")
    return pn.pane.Markdown(text, visible=not allowed, css_classes=["role-hint"])
