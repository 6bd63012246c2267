"""Per-installation secret files: private from the first byte, never empty, one value under a race."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.secret_files import secret_file


def test_one_private_non_empty_value_even_when_raced(tmp_path: Path) -> None:
    path = tmp_path / "d" / "secret"
    with ThreadPoolExecutor(8) as pool:
        values = set(pool.map(lambda _: secret_file(path), range(32)))
    assert len(values) == 1 and all(len(v) >= 40 for v in values)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["secret"], "no temporary files left behind"
    assert secret_file(path) == values.pop()


def test_an_empty_secret_is_refused_not_used(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("")
    with pytest.raises(RuntimeError, match="empty"):
        secret_file(path)
