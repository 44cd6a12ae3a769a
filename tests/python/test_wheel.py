"""`./loom wheel`: the wheel holds the whole package with libloom.so and
loom_tool, installs into a fresh virtual environment (no system packages, no
torch, no index) where `import loom` finds and loads its own libloom and the
command line runs its own loom_tool, and into a Python that has PyTorch,
where the CPU recorder works. Nothing comes from the checkout: no PYTHONPATH,
no LOOM_LIB / LOOM_TOOL, and the children run outside the tree."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

import loom
from loom import _paths

ROOT = _paths.REPO_ROOT


def _env():
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "LOOM_LIB", "LOOM_TOOL"):
        env.pop(name, None)
    return env


def _run(command, cwd, env=None, timeout=300):
    result = subprocess.run([str(c) for c in command], cwd=cwd,
                            env=_env() if env is None else env,
                            capture_output=True, text=True, check=False,
                            timeout=timeout)
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    return result


@pytest.fixture(scope="module", name="wheel")
def fixture_wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    result = _run([ROOT / "loom", "wheel", "-o", out], cwd=out.parent)
    wheel = out.parent / result.stdout.strip().splitlines()[-1]
    assert wheel.parent == out and wheel.exists(), result.stdout
    return wheel


def test_the_wheel_holds_the_package_and_the_binaries(wheel):
    # The distribution is loom-alloc (`loom` on PyPI is another package);
    # the import name is loom.
    assert wheel.name.startswith(
        f"loom_alloc-{loom.__version__}-py3-none-linux_")
    with zipfile.ZipFile(wheel) as archive:
        modes = {i.filename: i.external_attr >> 16 for i in archive.infolist()}
    sources = {str(p.relative_to(_paths.PACKAGE_DIR.parent))
               for p in _paths.PACKAGE_DIR.rglob("*.py")}
    assert sources <= set(modes), sources - set(modes)
    for binary in ("libloom.so", "loom_tool"):
        assert modes[f"loom/_bundled/{binary}"] & 0o111, binary
    for data in ("gpt2small_train_step.ltt", "llama1b.ltb", "measured.json"):
        assert f"loom/_bundled/data/{data}" in modes
    assert not [n for n in modes if "__pycache__" in n or n.endswith(".pyc")]


_IN_THE_VENV = """
import importlib.util, json, sys
import loom
from loom import _native, _paths, fingerprint
from loom.tools import trace
t = trace.Trace(events=[trace.Event("iter_begin", id=0),
                        trace.Event.alloc(1, 4096), trace.Event.alloc(2, 512),
                        trace.Event.free(1), trace.Event.free(2),
                        trace.Event("iter_end", id=0)])
trace.write_trace(t, "tiny.ltb")
assert trace.read_trace("tiny.ltb") == t
native = _native.load()
native.plan_trace("tiny.ltb", "tiny.lplan", {"time_limit": 1})
maps = open("/proc/self/maps").read()
print(json.dumps({
    "package": loom.__file__, "libloom": str(_paths.libloom()),
    "tool": str(_paths.loom_tool()),
    "demo_trace": str(_paths.data_file(
        "bench/data/traces/gpt2small_train_step.ltt")),
    "version": native.version(),
    "fingerprint": fingerprint.fingerprint_trace("tiny.ltb"),
    "libfmt": sorted({l.split()[-1] for l in maps.splitlines()
                      if "libfmt" in l}),
    "torch": importlib.util.find_spec("torch") is not None,
    "torch_imported": "torch" in sys.modules}))
"""


def test_a_fresh_venv_imports_loom_and_uses_its_own_binaries(wheel,
                                                             tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
          "--disable-pip-version-check", wheel], cwd=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    seen = json.loads(_run([python, "-c", _IN_THE_VENV],
                           cwd=work).stdout.splitlines()[-1])
    bundled = venv / "lib" / f"python{sys.version_info[0]}." \
        f"{sys.version_info[1]}" / "site-packages" / "loom" / "_bundled"
    assert seen["package"] == str(bundled.parent / "__init__.py")
    assert seen["libloom"] == str(bundled / "libloom.so")
    assert seen["tool"] == str(bundled / "loom_tool")
    assert seen["demo_trace"] == str(bundled / "data" /
                                     "gpt2small_train_step.ltt")
    assert seen["version"]
    assert seen["fingerprint"]
    assert (work / "tiny.lplan").stat().st_size > 0
    assert seen["torch"] is False and seen["torch_imported"] is False
    # The libraries beside libloom are the ones it loads (RUNPATH $ORIGIN).
    extra = sorted(str(p) for p in bundled.glob("lib*.so.*")
                   if not p.name.endswith(".copyright"))
    assert seen["libfmt"] == [p for p in extra if "libfmt" in p]
    if extra:
        ldd = _run(["ldd", bundled / "loom_tool"], cwd=work).stdout
        for path in extra:
            assert f"=> {path} " in ldd, ldd

    usage = _run([python, "-m", "loom", "--help"], cwd=work).stdout
    assert usage.startswith("usage: loom <subcommand>")
    report = json.loads(_run([venv / "bin" / "loom", "analyze", "tiny.ltb",
                              "--json"], cwd=work).stdout)
    assert report["allocs"] == 2
    rows = json.loads(_run([python, "-m", "loom", "compare", "tiny.ltb",
                            "--json", "--loom-time-limit", "1"],
                           cwd=work).stdout)
    assert {r["allocator"] for r in rows} >= {"pytorch", "loom"}
    # --plot needs matplotlib, which the fresh venv lacks: the table, then
    # one line naming the extra, no traceback.
    plot = subprocess.run([python, "-m", "loom", "compare", "tiny.ltb",
                           "--plot", "x.png"], cwd=work, env=_env(),
                          capture_output=True, text=True, check=False)
    assert plot.returncode == 1
    assert plot.stdout.startswith("input: tiny.ltb\n")
    assert plot.stderr.strip().splitlines() == [
        "loom compare: x.png not written: --plot needs matplotlib, which "
        "this Python cannot import (to get it: pip install "
        "'loom-alloc[plots]')"]
    # The demo prints its tables and says how to get the pictures (one
    # small workload here: the real ones take minutes).
    demo = subprocess.run([python, "-c", _SMALL_DEMO, "--time-limit", "1"],
                          cwd=work, env=_env(), capture_output=True,
                          text=True, check=False, timeout=300)
    assert demo.returncode == 0, demo.stderr
    assert "=== summary" in demo.stdout
    assert demo.stderr.strip().splitlines() == [
        "loom demo: pictures skipped: drawing them needs matplotlib, which "
        "this Python cannot import (to get it: pip install "
        "'loom-alloc[plots]')"]
    # The CPU recorder needs PyTorch and transformers: one line.
    for command in (["record-cpu", "--model", "llama", "-o", "x.ltb"],
                    ["what-if", "--model", "llama"]):
        record = subprocess.run([venv / "bin" / "loom", *command], cwd=work,
                                env=_env(), capture_output=True, text=True,
                                check=False)
        assert record.returncode == 1, record.stderr
        assert record.stderr.strip().splitlines() == [
            f"loom {command[0]}: recording a model needs PyTorch (torch) and "
            f"transformers, which this Python cannot import (to get them: "
            f"pip install 'loom-alloc[record]')"]
    # The launcher's subcommands are not the installed package's.
    assert "\n  setup " not in usage and "\n  wheel " not in usage
    for command in ("setup", "test", "wheel"):
        refused = subprocess.run([venv / "bin" / "loom", command], cwd=work,
                                 env=_env(), capture_output=True, text=True,
                                 check=False)
        assert refused.returncode == 2
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
        assert refused.stderr.startswith(
            f"loom: '{command}' is a command of a loom source checkout")


_SMALL_DEMO = """import sys
from loom.tools import demo
demo.workloads = lambda: (demo.Workload("dense", "a generated dense run",
                                        "builtin:dense"),)
sys.exit(demo.main(sys.argv[1:]))
"""


def test_the_plots_extra_brings_the_pictures(wheel, tmp_path):
    """Installed with [plots] into a venv that sees Debian's matplotlib
    (offline: the requirement is already met), --plot draws."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", venv],
         cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", "--no-index",
          "--disable-pip-version-check", f"{wheel}[plots]"], cwd=tmp_path)
    extras = json.loads(_run([python, "-c", (
        "import importlib.metadata as m, json; d = m.metadata('loom-alloc');"
        "print(json.dumps({'extras': d.get_all('Provides-Extra'),"
        " 'requires': m.requires('loom-alloc')}))")], cwd=tmp_path).stdout)
    assert sorted(extras["extras"]) == ["all", "plots", "record"]
    assert 'matplotlib>=3.6; extra == "plots"' in extras["requires"]
    assert 'torch>=2.5; extra == "record"' in extras["requires"]
    assert not [r for r in extras["requires"] if "extra ==" not in r]
    work = tmp_path / "work"
    work.mkdir()
    result = _run([venv / "bin" / "loom", "compare", "builtin:dense",
                   "--loom-time-limit", "1", "--plot", "x.png"], cwd=work)
    assert "plot written to x.png" in result.stderr
    assert (work / "x.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("extra", ["record", "all"])
def test_the_record_extra_records_a_model(wheel, tmp_path, extra):
    """Installed with [record] (or [all]: record and plots) into a fresh venv (no pip or setuptools of
    its own) that sees the packages of the Python running the tests, torch
    and transformers among them, through a .pth line: offline, pip finds
    the extra's requirements and theirs met and installs only the wheel;
    then `loom record-cpu` records a tiny model's steps and `loom analyze`
    reads them."""
    import torch  # pylint: disable=import-outside-toplevel
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; "
                 "print(sysconfig.get_paths()['purelib'])"],
                cwd=tmp_path).stdout.strip()
    with open(os.path.join(site, "machine-packages.pth"), "w",
              encoding="utf-8") as pth:
        # torch's own directory first, then every site directory of this
        # Python (numpy may come from Debian's).
        import site  # pylint: disable=import-outside-toplevel
        dirs = [os.path.dirname(os.path.dirname(torch.__file__))]
        dirs += [d for d in site.getsitepackages()
                 if os.path.isdir(d) and d not in dirs]
        pth.write("\n".join(dirs) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
          "--no-index", "--disable-pip-version-check", f"{wheel}[{extra}]"],
         cwd=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    _run([venv / "bin" / "loom", "record-cpu", "--model", "llama",
          "--steps", "2", "-o", "step.ltb"], cwd=work, timeout=600)
    assert (work / "step.ltb").stat().st_size > 0
    shown = _run([venv / "bin" / "loom", "analyze", "step.ltb"], cwd=work)
    assert "peak live" in shown.stdout
    if extra == "all":  # the pictures too
        _run([venv / "bin" / "loom", "compare", "step.ltb",
              "--loom-time-limit", "1", "--plot", "x.png"], cwd=work)
        assert (work / "x.png").read_bytes()[:4] == b"\x89PNG"


_WITH_TORCH = """
import json, torch, loom
from loom import _paths
with loom.record_cpu() as rec:
    x = torch.ones(1024)
    y = x * 2
    del x
print(json.dumps({"package": loom.__file__, "libloom": str(_paths.libloom()),
                  "requests": rec.summary()["requests"]}))
"""


def test_the_wheel_works_in_a_python_with_pytorch(wheel, tmp_path):
    import torch  # noqa: F401  pylint: disable=import-outside-toplevel
    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
          "--no-index", "--disable-pip-version-check", "--target", site,
          wheel], cwd=tmp_path)
    env = dict(_env(), PYTHONPATH=str(site))
    seen = json.loads(_run([sys.executable, "-c", _WITH_TORCH], cwd=tmp_path,
                           env=env).stdout.splitlines()[-1])
    assert seen["package"] == str(site / "loom" / "__init__.py")
    assert seen["libloom"] == str(site / "loom" / "_bundled" / "libloom.so")
    assert seen["requests"] == 2


def test_bad_arguments_are_one_line(tmp_path):
    for args, code, message in (
            (["--bogus"], 2, "loom wheel: unrecognized arguments: --bogus"),
            (["-o", "/proc/no-such-dir"], 1,
             "loom wheel: /proc/no-such-dir: No such file or directory")):
        result = subprocess.run([str(ROOT / "loom"), "wheel", *args],
                                cwd=tmp_path, env=_env(), capture_output=True,
                                text=True, check=False, timeout=600)
        assert result.returncode == code, result.stderr
        assert result.stderr.splitlines()[-1] == message
        assert "Traceback" not in result.stderr
