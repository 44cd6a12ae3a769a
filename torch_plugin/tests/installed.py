"""The real PyTorch and transformers, which `./loom setup` installs into the
project's Python (.venv: torch 2.13.0's CPU build, transformers 5.18.0), and
a Python in which they are missing, for the tests of what loom says then.

A full setup has both, so a test that needs one fails (never skips) when it
cannot be imported, and says to run `./loom setup`."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parent.parent
SETUP = "./loom setup"


def real(module):
    """The imported `module` ("torch", "transformers"); fails the test,
    naming `./loom setup`, when this Python cannot import it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        problem = error
    pytest.fail(
        f"{module} cannot be imported by {sys.executable} ({problem}). "
        f"loom's tests run against the real PyTorch (CPU build) and "
        f"transformers: run `{SETUP}` (it installs them into .venv) and "
        f"the tests with .venv/bin/python (`./loom test` does both)",
        pytrace=False)
    return None  # not reached


# Prepended to a child's script: importing any of MODULES (or a submodule)
# fails exactly as when the package is not installed.
_BLOCK = """\
import sys
_BLOCKED = {modules!r}


class _NotInstalled:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}",
                                      name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


def run_python(script, *, without=(), env=None, timeout=120):
    """Runs `script` (dedented) in a fresh interpreter with the loom package
    importable, where the modules in `without` cannot be imported. Returns
    the CompletedProcess (text)."""
    code = textwrap.dedent(script)
    if without:
        code = _BLOCK.format(modules=tuple(without)) + code
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PLUGIN_DIR), child_env.get("PYTHONPATH")) if p)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        child_env.pop(name, None)
    return subprocess.run([sys.executable, "-c", code], cwd=PLUGIN_DIR,
                          env=child_env, capture_output=True, text=True,
                          check=False, timeout=timeout)


def last_json(result):
    """The JSON object a child printed on its last stdout line."""
    assert result.stdout.strip(), f"no output; stderr:\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])
