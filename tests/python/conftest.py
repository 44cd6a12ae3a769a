"""Puts the `loom` package (torch_plugin/) on sys.path for the tests.

A test that needs loom_tool fails (naming the build command) when it is not
built; it never skips."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch_plugin"))

import pytest  # noqa: E402

BUILD = "bazel build //cli:loom_tool //torch_plugin:libloom.so"


@pytest.fixture()
def loom_tool():
    """Path of loom_tool; the test fails when it is not built."""
    from loom import _paths  # pylint: disable=import-outside-toplevel
    try:
        return _paths.loom_tool()
    except _paths.NotBuiltError as error:
        pytest.fail(f"loom_tool is not built ({error}); run `{BUILD}` first",
                    pytrace=False)
