"""Checks at `import ciclo` that ciclo 0.1's distribution `ciclo` (same package) is not installed."""

from __future__ import annotations

import importlib.metadata
import warnings


def warn_if_old_ciclo_installed() -> None:
    """Warns when the old `ciclo` distribution shares the `ciclo` package with ciclo-core.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error")
        ...     warn_if_old_ciclo_installed()
    """
    try:
        distribution = importlib.metadata.distribution("ciclo")  # ciclo 0.1's distribution
    except importlib.metadata.PackageNotFoundError:
        return
    # A distribution named `ciclo` that installs no `ciclo` package (a future meta-package) is harmless.
    if not any(file.parts[:1] == ("ciclo",) for file in distribution.files or []):
        return
    warnings.warn(
        f"the distribution `ciclo` {distribution.version} (ciclo 0.1) is installed beside ciclo-core, "
        "and both install the package `ciclo`: their files overwrite each other. Remove the old one, "
        "then reinstall ciclo-core, whose files the removal deletes too:\n"
        "    pip uninstall ciclo\n"
        "    pip install --force-reinstall --no-deps ciclo-core",
        UserWarning,
        stacklevel=3,
    )
