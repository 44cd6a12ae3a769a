"""Puts the `loom` package (torch_plugin/) on sys.path for the tests, and the
fixtures and helpers most tests share.

What a test exercises must be there: a missing libloom.so or loom_tool fails
the test (with the build command), and a missing torch or transformers
(fixtures `torch`, `transformers`: the real packages `./loom setup`
installs) fails it naming `./loom setup`; nothing is skipped."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402

import installed  # noqa: E402

BUILD = "bazel build //cli:loom_tool //torch_plugin:libloom.so"


def built(which):
    """Path of loom's `which` ("libloom" or "loom_tool"); fails the test,
    naming the build command, when it is not built."""
    from loom import _paths  # pylint: disable=import-outside-toplevel
    try:
        return getattr(_paths, which)()
    except _paths.NotBuiltError as error:
        pytest.fail(f"{which} is not built ({error}); run `{BUILD}` first",
                    pytrace=False)


@pytest.fixture()
def loom_tool():
    """Path of loom_tool; the test fails when it is not built."""
    return built("loom_tool")


@pytest.fixture()
def libloom():
    """Path of libloom.so; the test fails when it is not built."""
    return built("libloom")


@pytest.fixture(name="torch")
def fixture_torch():
    """The real torch (the CPU build in .venv); the test fails, naming
    `./loom setup`, when it cannot be imported."""
    return installed.real("torch")


@pytest.fixture(name="transformers")
def fixture_transformers():
    """The real transformers; the test fails, naming `./loom setup`, when it
    cannot be imported."""
    return installed.real("transformers")


def _force_reset():
    from loom import _state  # pylint: disable=import-outside-toplevel
    session = _state.current()
    if session is None:
        return
    session.stop_planner()
    session.torch_allocator = None  # a fake torch's: nothing to give back
    _state.set_current(None)
    try:
        session.native.shutdown()
    except Exception:  # pylint: disable=broad-except
        pass


@pytest.fixture()
def no_session():
    """A process with no loom session (one a test left is shut down).
    Yields the `loom` package."""
    import loom  # pylint: disable=import-outside-toplevel
    _force_reset()
    yield loom
    _force_reset()


@pytest.fixture()
def loom_env(monkeypatch, no_session):
    """A process with no loom session, no torchrun variables, libloom built
    (else the test fails). Yields the `loom` package."""
    built("libloom")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return no_session
