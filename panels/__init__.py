"""Dashboard panes: each a ``pn.viewable.Viewer`` over a ``param`` state object that calls services.

Every pane renders alone (``pn.panel(pane)`` in a notebook) and inside the served template.
"""
