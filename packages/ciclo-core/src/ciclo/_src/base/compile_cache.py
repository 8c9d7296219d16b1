"""JAX's persistent compilation cache, on from a loop's start: a rerun reads its programs back.

Unless the program configured the cache itself (`jax_compilation_cache_dir` in `jax.config`, or
JAX_COMPILATION_CACHE_DIR), the first loop of a process points JAX at `$CICLO_COMPILE_CACHE`, else
`ciclo/jax` in the user's cache folder (`$XDG_CACHE_HOME`, else `~/.cache`); `CICLO_COMPILE_CACHE=off`
leaves it off. In a job of several processes JAX writes the entries from process 0 alone, and every
process reads them: the job writes each program once, into a folder all its processes should share
(docs/resume.md, "Warm restarts").
"""

from __future__ import annotations

import collections
import functools
import os
from typing import Any, Final

import jax

from ciclo._src.base.checks import warn

ENV: Final = "CICLO_COMPILE_CACHE"
MIN_COMPILE_TIME: Final = 0.0
"""Seconds a program must take to compile to be cached. JAX's default, 1 s, leaves out most of a CPU
run's programs (a small model's step compiles in a fraction of a second; the optimizer's zeros and the
history's host copies in milliseconds), and reading any of them back costs less than compiling it."""

_COMPILED: Final = "/jax/core/compile/backend_compile_duration"  # each program, compiled or read back
_HIT: Final = "/jax/compilation_cache/cache_hits"
_heard: collections.Counter[str] = collections.Counter()
_config: Any = jax.config  # its options are attributes made at run time, untyped


def _count(event: str, *_: Any, **__: Any) -> None:
    if event in (_COMPILED, _HIT):
        _heard[event] += 1


@functools.cache
def start() -> None:
    """Once per process: counts the programs compiled and, unless configured or off, turns the cache on.

    Example:
        >>> import jax
        >>> start()
        >>> jax.config.jax_compilation_cache_dir is not None  # the program's own directory, else ciclo's
        True
    """
    jax.monitoring.register_event_listener(_count)
    jax.monitoring.register_event_duration_secs_listener(_count)
    directory = os.environ.get(ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ciclo", "jax"
    )
    if _config.jax_compilation_cache_dir is not None or directory == "off":
        return
    directory = os.path.abspath(os.path.expanduser(directory))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        warn(
            f"ciclo could not create the compilation cache directory {directory} ({error}): each run "
            f"compiles its programs anew. Set {ENV} to a writable directory, or to off"
        )
        return
    _config.update("jax_compilation_cache_dir", directory)
    if _config.jax_persistent_cache_min_compile_time_secs == 1.0:  # JAX's default: not the user's
        _config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME)


def compiled() -> str | None:
    """`"compiled N programs, M from the cache in DIR"` since the first loop; None without a cache or compile.

    Example:
        >>> compiled() is None or compiled().startswith("compiled ")
        True
    """
    directory, programs = _config.jax_compilation_cache_dir, _heard[_COMPILED]
    if directory is None or not _config.jax_enable_compilation_cache or not programs:
        return None
    return f"compiled {programs} program{'s' * (programs != 1)}, {_heard[_HIT]} from the cache in {directory}"
