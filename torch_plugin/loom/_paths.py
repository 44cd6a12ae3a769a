"""Where loom's built artefacts are: loom_tool and libloom.so.

Looked up in this order: the environment (LOOM_TOOL, LOOM_LIB), then the
Bazel output tree of the source checkout this package sits in
(<repo>/bazel-bin/...).
"""

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent


class NotBuiltError(RuntimeError):
    """A native artefact is missing: the checkout has not been built."""


def _find(env_var, relative):
    explicit = os.environ.get(env_var)
    if explicit:
        path = Path(explicit)
        if not path.exists():
            raise NotBuiltError(f"{env_var}={explicit} does not exist")
        return path
    path = REPO_ROOT / "bazel-bin" / relative
    if path.exists():
        return path
    raise NotBuiltError(
        f"{relative} is not built; run `./loom setup` and "
        f"`bazel build //cli:loom_tool //torch_plugin:libloom.so` in {REPO_ROOT}, "
        f"or set {env_var}")


def loom_tool():
    """Path of the loom_tool binary."""
    return _find("LOOM_TOOL", "cli/loom_tool")


def libloom():
    """Path of libloom.so."""
    return _find("LOOM_LIB", "torch_plugin/libloom.so")
