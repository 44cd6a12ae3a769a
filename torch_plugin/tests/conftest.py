"""Puts the `loom` package (torch_plugin/) on sys.path for the tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402

def _force_reset():
    from loom import control
    session = control.current()
    if session is None:
        return
    session.stop_planner()
    session.torch_allocator = None  # a fake torch's: nothing to give back
    control._session = None  # pylint: disable=protected-access
    try:
        session.native.shutdown()
    except Exception:  # pylint: disable=broad-except
        pass


@pytest.fixture()
def loom_env(monkeypatch):
    """A process with no loom session, no torchrun variables, libloom built
    (else the test is skipped). Yields the `loom` package."""
    from loom import _paths
    try:
        _paths.libloom()
    except _paths.NotBuiltError as error:
        pytest.skip(f"libloom.so is not built: {error}")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    import loom
    _force_reset()
    yield loom
    _force_reset()
