"""Small files written whole: whoever reads one, even after a kill, sees the old file or the new one."""

from __future__ import annotations

import os


def write_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through `path + ".tmp"`, synced to disk, then renamed over `path`.

    One writer per file (process 0, or a single logger): a `.tmp` a kill left
    behind is overwritten by the next write.

    Example:
        >>> import os, pathlib, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "settings.json")
        >>> write_atomically(path, '{"mode": "max"}')
        >>> pathlib.Path(path).read_text()
        '{"mode": "max"}'
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
