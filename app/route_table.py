"""The REST route table: every REST path behind one URL pattern of the server (see :class:`RouteTable`)."""

from __future__ import annotations

import re

from app.api.base import Route


def _pattern(path: str, *, named: bool = True) -> str:
    """A route's path as a regular expression: ``{name}`` is one path segment (a named group if ``named``)."""
    pieces = re.split(r"\{(\w+)\}", path)  # literal, name, literal, name, ..., literal
    return "".join(re.escape(piece) if i % 2 == 0 else (f"(?P<{piece}>[^/]+)" if named else "[^/]+")
                   for i, piece in enumerate(pieces))


class RouteTable:
    """Every REST path behind ONE URL pattern of the server, so a request meets one regular expression (in C)
    instead of one per path; the handler then finds its path's routes by a dictionary lookup (literal paths)
    or, for templated ones, by trying those alone, literal before templated as before:
    ``POST /clusters/import`` is not ``GET /clusters/{cluster}``."""

    def __init__(self, routes: list[Route]) -> None:
        by_path: dict[str, dict[str, Route]] = {}
        for r in routes:
            by_path.setdefault(r.path, {})[r.method] = r
        ordered = sorted(by_path, key=lambda path: path.count("{"))
        self.literal = {path: by_path[path] for path in ordered if "{" not in path}
        self.templated = [(re.compile(_pattern(path) + "$"), by_path[path]) for path in ordered if "{" in path]
        self.pattern = "(?:" + "|".join(_pattern(path, named=False) for path in ordered) + ")$"

    def lookup(self, path: str) -> tuple[dict[str, Route], dict[str, str]] | None:
        """The routes (by method) of ``path`` and its path parameters, still URL-escaped."""
        methods = self.literal.get(path)
        if methods is not None:
            return methods, {}
        for regex, methods in self.templated:
            match = regex.match(path)
            if match:
                return methods, match.groupdict()
        return None
