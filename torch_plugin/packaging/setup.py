"""setup.py of the loom wheel (distribution loom-alloc: `loom` on PyPI is
an unrelated package; the import name is `loom`). build_wheel.py copies it
into a staging directory beside the package (loom/, with libloom.so,
loom_tool and the libraries they need in loom/_bundled/) and builds there;
it is not run in the checkout. The extras (plots, record, all) are
loom/_extras.py's EXTRAS.

The wheel is tagged py3-none-<platform>: the package is pure Python (libloom
is loaded with ctypes, no extension module), so one wheel serves every
Python 3 on the platform, but the bundled binaries are native.
"""

import importlib.util
import re
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.dist import Distribution

try:  # setuptools >= 70.1 has its own
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent

# The distribution name and the extras: loom/_extras.py, loaded alone (it
# needs only the standard library at import; the package is not imported).
_SPEC = importlib.util.spec_from_file_location("loom_extras",
                                               HERE / "loom" / "_extras.py")
_extras = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_extras)
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    (HERE / "loom" / "__init__.py").read_text(), re.M)[1]
PLATFORM = sysconfig.get_platform().replace("-", "_").replace(".", "_")


class NativeDistribution(Distribution):
    """Holds native code (the bundled binaries): the wheel's root is
    platlib, and the wheel gets a platform tag."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """A platform wheel that fits any Python 3 (py3-none-<platform>)."""

    def get_tag(self):
        return "py3", "none", PLATFORM


setup(
    name=_extras.DIST,
    version=VERSION,
    description="A planned, virtual-memory GPU allocator for PyTorch "
    "training, with offline tools that predict memory without a GPU",
    packages=["loom", "loom.tools"],
    # The package needs nothing beyond the standard library; the extras
    # bring the pictures (plots) and the CPU recorder (record).
    install_requires=[],
    extras_require={extra: list(requirements)
                    for extra, requirements in _extras.EXTRAS.items()},
    package_data={"loom": ["_bundled/*", "_bundled/data/*"]},
    entry_points={"console_scripts": ["loom = loom.tools.cli:main"]},
    cmdclass={"bdist_wheel": PlatformWheel},
    distclass=NativeDistribution,
    zip_safe=False,
)
