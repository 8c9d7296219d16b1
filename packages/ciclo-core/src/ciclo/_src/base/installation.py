"""Checks at `import ciclo` that the old `ciclo` distribution (0.1.x) is not installed too.

ciclo 0.1 was published as the distribution `ciclo`; ciclo-core installs the
same import package, `ciclo`. With both installed, whichever was installed last
owns `ciclo/__init__.py` and the other's leftover modules sit beside it, and
`pip uninstall ciclo` deletes files ciclo-core needs. `import ciclo` warns when
it finds the old distribution, and says how to repair the environment.

The check reads installed metadata only (no import of the old package): about
as costly as the `importlib.metadata.version("ciclo-core")` that `import ciclo`
does anyway, whose directory listings it reuses.
"""

from __future__ import annotations

import importlib.metadata
import warnings

OLD_DISTRIBUTION = "ciclo"
"""The distribution name ciclo 0.1.x was published under."""


def old_ciclo_version() -> str | None:
    """The version of the old `ciclo` distribution when one is installed that ships `ciclo/`, else None.

    Example:
        >>> old_ciclo_version() is None
        True
    """
    try:
        distribution = importlib.metadata.distribution(OLD_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    # A distribution named `ciclo` that installs no `ciclo` package (a future meta-package) is harmless.
    files = distribution.files or []
    if not any(file.parts[:1] == ("ciclo",) for file in files):
        return None
    return distribution.version


def warn_if_old_ciclo_installed() -> None:
    """Warns when the old `ciclo` distribution shares the `ciclo` package with ciclo-core.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error")
        ...     warn_if_old_ciclo_installed()
    """
    version = old_ciclo_version()
    if version is None:
        return
    warnings.warn(
        f"the distribution `ciclo` {version} (ciclo 0.1) is installed beside ciclo-core, and both "
        "install the package `ciclo`: their files overwrite each other. Remove the old one, then "
        "reinstall ciclo-core, whose files the removal deletes too:\n"
        "    pip uninstall ciclo\n"
        "    pip install --force-reinstall --no-deps ciclo-core",
        UserWarning,
        stacklevel=3,
    )
