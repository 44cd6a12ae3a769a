"""Where loom's built artefacts are: loom_tool, libloom.so and the data the
command line ships with.

Looked up in this order: the environment (LOOM_TOOL, LOOM_LIB), then the
package's own copy (loom/_bundled/, put there by `./loom wheel`: an installed
wheel), then the Bazel output tree of the source checkout this package sits
in (<repo>/bazel-bin/...). Every lookup goes by the package's location,
never by the current directory.
"""

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent
# What a wheel bundles (torch_plugin/packaging/build_wheel.py): libloom.so,
# loom_tool and the shared libraries they need beyond the C and C++ runtime
# (found through their RUNPATH $ORIGIN), and the demo's trace under data/.
BUNDLED_DIR = PACKAGE_DIR / "_bundled"


class NotBuiltError(RuntimeError):
    """A native artefact is missing: the checkout has not been built."""


def _find(env_var, relative):
    explicit = os.environ.get(env_var)
    if explicit:
        path = Path(explicit)
        if not path.exists():
            raise NotBuiltError(f"{env_var}={explicit} does not exist")
        return path
    for path in (BUNDLED_DIR / Path(relative).name,
                 REPO_ROOT / "bazel-bin" / relative):
        if path.exists():
            return path
    if BUNDLED_DIR.exists():
        raise NotBuiltError(
            f"{Path(relative).name} is missing from this installation "
            f"({BUNDLED_DIR}); reinstall the wheel, or set {env_var}")
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


def data_file(relative):
    """A data file the command line uses (`relative` to the repository,
    e.g. bench/data/traces/x.ltt): the wheel's copy under _bundled/data/,
    else the checkout's."""
    copy = BUNDLED_DIR / "data" / Path(relative).name
    return copy if copy.exists() else REPO_ROOT / relative
