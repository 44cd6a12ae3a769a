"""setup.py of the loom wheel. build_wheel.py copies it into a staging
directory beside the package (loom/, with libloom.so, loom_tool and the
libraries they need in loom/_bundled/) and builds there; it is not run in
the checkout.

The wheel is tagged py3-none-<platform>: the package is pure Python (libloom
is loaded with ctypes, no extension module), so one wheel serves every
Python 3 on the platform, but the bundled binaries are native.
"""

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
    name="loom",
    version=VERSION,
    description="A planned, virtual-memory GPU allocator for PyTorch "
    "training, with offline tools that predict memory without a GPU",
    packages=["loom", "loom.tools"],
    package_data={"loom": ["_bundled/*", "_bundled/data/*"]},
    entry_points={"console_scripts": ["loom = loom.tools.cli:main"]},
    cmdclass={"bdist_wheel": PlatformWheel},
    distclass=NativeDistribution,
    zip_safe=False,
)
