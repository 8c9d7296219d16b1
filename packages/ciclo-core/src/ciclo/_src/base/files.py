"""Files ciclo writes, and the directories it owns (backups, checkpoints, loggers'): never via links."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from typing import IO, Any

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # not on Windows, where links need privileges to make


class LinkError(FileExistsError):
    """A directory ciclo writes holds a link: refused, as following it could write or delete elsewhere.

    Example:
        >>> import os, tempfile
        >>> directory = tempfile.mkdtemp()
        >>> os.symlink(tempfile.gettempdir(), os.path.join(directory, "history"))
        >>> check_closed(directory, "backup directory")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ciclo._src.base.files.LinkError: backup directory ... holds .../history, a symbolic link ...
    """


def check_closed(directory: str, what: str) -> None:
    """Raises `LinkError` if anything under `directory` (itself excepted) is a symbolic or hard-linked file.

    Example:
        >>> import tempfile
        >>> check_closed(tempfile.mkdtemp(), "backup directory")
    """
    if "://" in directory or not os.path.isdir(directory):
        return
    for root, folders, files in os.walk(directory):  # does not follow links
        for name in folders + files:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:  # renamed or removed since listed (another process's atomic write)
                continue
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(path)
                raise LinkError(
                    f"{what} {directory} holds {path}, a symbolic link (to {target}): ciclo never follows "
                    "a link out of a directory it writes, as writing or cleaning up through it would touch "
                    "files elsewhere. Remove the link, or give ciclo a directory of its own"
                )
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                raise LinkError(
                    f"{what} {directory} holds {path}, a file with {info.st_nlink - 1} other hard link(s): "
                    "ciclo never writes a file that is also elsewhere. Remove it, or give ciclo a directory "
                    "of its own"
                )


def write_atomically(path: str, text: str | bytes) -> None:
    """Writes `text` (UTF-8, or bytes) to `path` through `path + ".tmp"`, synced, then renamed.

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
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a kill's leftover, or a link planted there: removed, not followed
    descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    data = text.encode() if isinstance(text, str) else text
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def open_own(path: str, mode: str) -> IO[Any]:
    r"""`open(path, mode)` ("r", "a" or "ab") that refuses a symbolic link at `path` with `LinkError`.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "log.csv")
        >>> with open_own(path, "a") as file:
        ...     _ = file.write("step\n")
        >>> with open_own(path, "r") as file:
        ...     file.read()
        'step\n'
    """
    append = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    flags = {"r": os.O_RDONLY, "a": append, "ab": append}[mode]
    try:
        descriptor = os.open(path, flags | _NOFOLLOW, 0o644)
    except OSError as error:
        if os.path.islink(path):
            raise LinkError(
                f"{path} is a symbolic link: ciclo never writes or reads its own files through a link. "
                "Remove it, or give ciclo another path"
            ) from None
        raise error from None
    if mode == "ab":
        return os.fdopen(descriptor, mode)
    return os.fdopen(descriptor, mode, encoding="utf-8", newline="")


def remove_own(directory: str, name: str, pattern: re.Pattern[str]) -> bool:
    r"""Deletes `directory/name` if a regular file in `directory` whose name `pattern` matches; True if so.

    Example:
        >>> import os, re, tempfile
        >>> directory = tempfile.mkdtemp()
        >>> for name in ("rows-0-4.json", "notes.txt"):
        ...     open(os.path.join(directory, name), "w").close()
        >>> chunk = re.compile(r"rows-\d+-\d+\.json")
        >>> [remove_own(directory, name, chunk) for name in ("rows-0-4.json", "notes.txt")]
        [True, False]
    """
    path = os.path.join(directory, name)
    if pattern.fullmatch(name) is None or os.path.dirname(os.path.realpath(path)) != os.path.realpath(
        directory
    ):
        return False
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
