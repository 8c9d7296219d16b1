"""`--dist loadgroup` under pytest 9: the tests of one `xdist_group` go to one worker again.

pytest-xdist 3.8 groups a test by renaming it `<nodeid>@<group>` (`item._nodeid`), which pytest 9
no longer reads (a node's id is `item._id`): every test then went to any worker, and the
session-scoped fixtures of a group (test_after_training's 5 adapters trained and restored in a new
process, the 2-process fsdp fault runs) were built once per worker. nox loads this plugin where it
runs `--dist loadgroup` (`-p support.xdist_groups`); it renames where xdist's renaming did not take.
"""

from __future__ import annotations

import pytest
from _pytest.nodeid import NodeId


@pytest.hookimpl(trylast=True)  # after xdist's own renaming, which this one then finds done or not
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", False):  # set on the workers of `--dist loadgroup`
        return
    for item in items:
        names = sorted(
            {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
        )
        suffix = f"@{'_'.join(names)}"
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]
            if not item.nodeid.endswith(suffix):
                raise pytest.UsageError(f"cannot give {item.nodeid} its xdist group: see {__file__}")
