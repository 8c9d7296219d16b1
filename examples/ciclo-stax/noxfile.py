"""ciclo-stax's test matrix: its tests on several jax versions (`nox`, or `nox -s "tests(jax='0.8.3')"`).

Copy it next to your adapter's pyproject.toml. Each session installs the
package with its `test` extra (ciclo-core[testing]: the adapter kit and pytest)
and the jax version of its parameter, then runs the package's tests.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|venv"

JAX_VERSIONS = ["0.8.3", "0.9.2", "latest"]
"""The oldest jax the package supports, and newer ones up to the latest release."""


@nox.session
@nox.parametrize("jax", JAX_VERSIONS)
def tests(session: nox.Session, jax: str) -> None:
    """The package's tests, with the kit's clauses, on one jax version."""
    session.install(".[test]", "jax" if jax == "latest" else f"jax=={jax}")
    session.run("python", "-c", "import jax; print('jax', jax.__version__)")
    session.run("pytest", *session.posargs)
