"""A download's progress, read from its pod's log: the lines ``hf download`` (tqdm) and ``cp -v`` print.

``Fetching 9 files:  44%|████▍     | 4/9 [00:04<00:05, 1.00it/s]`` gives files done and total; a file's own
bar ``config.json: 100%|██████████| 1.02k/1.02k [00:00<00:00, 2.1MB/s]`` its bytes (tqdm's unit scale:
k, M, G, T are powers of 1000); each ``'src' -> 'dst'`` line of the copy is one file on the bucket.
"""

from __future__ import annotations

import re

from services.training.downloads.models import Progress

_FETCHING = re.compile(r"^Fetching (\d+) files:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+)")
_FILE = re.compile(r"^(?P<name>[^:|]+?):\s+(?P<pct>\d+)%\|[^|]*\|\s*(?P<done>[\d.]+[kMGT]?)/(?P<total>[\d.]+[kMGT]?)")
_ERROR = re.compile(r"(\w+Error\b|^Error: |^cp: )")
_COPIED = re.compile(r"^'.+' -> '.+'$")
_SCALE = {"": 1, "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4}


def size(text: str) -> int:
    """tqdm's scaled number (``4.97G``) in units."""
    unit = text[-1] if text and text[-1] in "kMGT" else ""
    return int(float(text[: len(text) - len(unit)] or 0) * _SCALE[unit])


def parse(download_lines: list[str], publish_lines: list[str]) -> Progress:
    progress = Progress()
    per_file: dict[str, int] = {}
    for line in download_lines:
        fetching = _FETCHING.match(line)
        if fetching:
            progress.files_total = int(fetching.group(1))
            progress.files_done = int(fetching.group(2))
            continue
        one = _FILE.match(line)
        if one:
            per_file[one.group("name")] = size(one.group("done"))
            progress.current_file = one.group("name") if int(one.group("pct")) < 100 else None
    progress.bytes_done = sum(per_file.values())
    progress.copied = sum(1 for line in publish_lines if _COPIED.match(line))
    lines = [line for line in (*download_lines, *publish_lines) if line.strip()]
    progress.error = next((line[:500] for line in lines if _ERROR.search(line)), None)
    progress.last_line = lines[-1][:500] if lines else None
    return progress
