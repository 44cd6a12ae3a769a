"""`./loom wheel [-o DIR]`: an installable wheel of the `loom` package.

The launcher builds libloom.so and loom_tool first; this script stages the
package (torch_plugin/loom) with loom/_bundled/ holding libloom.so,
loom_tool, the shared libraries they link beyond the C and C++ runtime
(Debian's libfmt, found at run time through their RUNPATH $ORIGIN) and the
demo's trace, then builds the wheel with pip and the setuptools already
installed (`pip wheel --no-build-isolation --no-index`: nothing is
downloaded). setup.py and pyproject.toml beside this file are the build's.

The wheel (loom_alloc-<version>-py3-none-<platform>.whl: the distribution
is `loom-alloc`, the import name `loom`) installs into any Python 3 on the
platform: `import loom` and the command line need nothing else. Its extras
(loom/_extras.py) bring the rest: `plots` (matplotlib: demo and --plot
pictures), `record` (PyTorch and transformers: `loom record-cpu`, `loom
what-if --model`), `all`. loom.enable() needs the user's own PyTorch. The
bundled binaries need glibc and libstdc++ at least as new as the build
machine's.
"""

import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PACKAGE = ROOT / "torch_plugin" / "loom"
BINARIES = (ROOT / "bazel-bin" / "torch_plugin" / "libloom.so",
            ROOT / "bazel-bin" / "cli" / "loom_tool")
# `loom demo`'s inputs (torch_plugin/loom/tools/demo.py), bundled flat under
# _bundled/data/ (loom._paths.data_file looks them up by name).
DATA = (ROOT / "bench" / "data" / "traces" / "gpt2small_train_step.ltt",
        ROOT / "bench" / "data" / "traces" / "gpu" / "h200_2026-11-26" /
        "llama1b.ltb",
        ROOT / "bench" / "data" / "traces" / "gpu" / "h200_2026-11-26" /
        "measured.json")
# Libraries every Linux system with a C++ runtime has: never bundled.
RUNTIME = re.compile(r"^(linux-vdso|linux-gate|ld-linux.*|libc|libm|"
                     r"libpthread|libdl|librt|libutil|libresolv|libstdc\+\+|"
                     r"libgcc_s)\.so")
PROG = "loom wheel"
# The wheel's file name starts with the distribution name, normalised
# (loom-alloc -> loom_alloc).
WHEEL_PREFIX = "loom_alloc"


class WheelError(Exception):
    """Why the wheel cannot be built (one line)."""


def needed_libraries(binary):
    """{soname: path} of the shared libraries `binary` loads (ldd) that are
    not part of the C/C++ runtime."""
    try:
        out = subprocess.run(["ldd", str(binary)], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise WheelError(f"ldd {binary} failed: {error}") from None
    found = {}
    for line in out.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if not arrow or RUNTIME.match(name):
            continue
        path = rest.split(" (")[0].strip()
        if path == "not found" or not path:
            raise WheelError(f"{binary.name} needs {name}, which is not "
                             f"found on this machine")
        found[name] = Path(path)
    return found


def copyright_file(library):
    """The Debian copyright file of the package that ships `library`, or
    None (not a Debian system, or not found)."""
    try:
        owner = subprocess.run(["dpkg", "-S", str(library.resolve())],
                               capture_output=True, text=True, check=False)
    except OSError:
        return None
    package = owner.stdout.split(":")[0].strip()
    notice = Path("/usr/share/doc") / package / "copyright"
    return notice if owner.returncode == 0 and notice.exists() else None


def stage(into):
    """Copies the package and what it bundles under `into`."""
    for binary in BINARIES:
        if not binary.exists():
            raise WheelError(f"{binary} is not built (`./loom wheel` builds "
                             f"it; or bazel build //cli:loom_tool "
                             f"//torch_plugin:libloom.so)")
    shutil.copy(HERE / "setup.py", into / "setup.py")
    shutil.copy(ROOT / "LICENSE", into / "LICENSE")
    shutil.copy(HERE / "pyproject.toml", into / "pyproject.toml")
    package = into / "loom"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "_bundled"))
    bundled = package / "_bundled"
    (bundled / "data").mkdir(parents=True)
    libraries = {}
    for binary in BINARIES:
        libraries.update(needed_libraries(binary))
        shutil.copyfile(binary, bundled / binary.name)
    for name, path in sorted(libraries.items()):
        shutil.copyfile(path, bundled / name)
        notice = copyright_file(path)
        if notice is not None:  # the library's licence travels with it
            shutil.copyfile(notice, bundled / f"{name}.copyright")
    for path in bundled.iterdir():
        if path.is_file():
            path.chmod(0o644 if path.suffix == ".copyright" else 0o755)
    for path in DATA:
        shutil.copyfile(path, bundled / "data" / path.name)
    return sorted(libraries)


def build(out_dir):
    """Builds the wheel into `out_dir`; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="loom-wheel-") as temp:
        staged = Path(temp) / "src"
        staged.mkdir()
        stage(staged)
        built = Path(temp) / "dist"
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps",
                   "--no-build-isolation", "--no-index",
                   "--disable-pip-version-check", "-q", "-w", str(built),
                   str(staged)]
        result = subprocess.run(command, capture_output=True, text=True,
                                check=False, cwd=temp)
        wheels = sorted(built.glob(f"{WHEEL_PREFIX}-*.whl")) \
            if built.exists() else []
        if result.returncode != 0 or len(wheels) != 1:
            output = (result.stderr or result.stdout).strip().splitlines()
            last = output[-1] if output else f"exit status {result.returncode}"
            raise WheelError(f"pip wheel failed: {last}")
        check(wheels[0])
        target = out_dir / wheels[0].name
        shutil.copyfile(wheels[0], target)
    return target


def check(wheel):
    """The wheel holds the bundled binaries, executable."""
    with zipfile.ZipFile(wheel) as archive:
        modes = {info.filename: info.external_attr >> 16
                 for info in archive.infolist()}
    for binary in BINARIES:
        name = f"loom/_bundled/{binary.name}"
        if name not in modes:
            raise WheelError(f"{wheel.name} lacks {name}")
        if not modes[name] & stat.S_IXUSR:
            raise WheelError(f"{wheel.name}: {name} is not executable")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise WheelError(message)


def main(argv):
    parser = _Parser(
        prog=PROG,
        description="Builds an installable wheel of the loom Python package "
        "with libloom.so and loom_tool inside (and the shared libraries they "
        "need beyond the C/C++ runtime), offline, with the setuptools "
        "installed here. Install it with `pip install loom_alloc-*.whl` "
        "into any Python 3 environment on this platform (the distribution "
        "is loom-alloc, the import name loom); its extras bring the "
        "pictures ('loom_alloc-*.whl[plots]': matplotlib) and the CPU "
        "recorder ([record]: PyTorch and transformers); loom.enable() needs "
        "PyTorch.")
    parser.add_argument("-o", "--out", default="dist",
                        help="directory for the wheel (default: dist, in the "
                        "current directory)")
    try:
        args = parser.parse_args(argv)
    except WheelError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    try:
        wheel = build(Path(args.out))
    except WheelError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"{PROG}: {error.filename or ''}: {error.strerror}",
              file=sys.stderr)
        return 1
    print(os.path.join(args.out, wheel.name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
