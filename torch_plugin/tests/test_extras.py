"""The optional pieces (loom._extras): each missing one is reported in one
line that names the command that installs it, never with a traceback, and
what does not need it still runs (the demo's and compare's tables).

A missing module is simulated without touching the environment: the
children run with a sitecustomize.py on PYTHONPATH that sets
sys.modules[name] = None for each name in LOOM_TEST_BLOCK, so `import name`
fails there as it does where the package is not installed. No network."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loom import _extras
from loom.tools import cli

PLUGIN_DIR = Path(__file__).resolve().parent.parent

_BLOCKER = """import os, sys
for _name in os.environ.get("LOOM_TEST_BLOCK", "").split(","):
    if _name:
        sys.modules[_name] = None
"""


def _run(tmp_path, block, args, code=None, timeout=300):
    """Runs `python -m loom *args` (or `python -c code *args`) in tmp_path
    with the modules of `block` unimportable."""
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_BLOCKER)
    env = dict(os.environ, LOOM_TEST_BLOCK=",".join(block),
               PYTHONPATH=os.pathsep.join([str(site), str(PLUGIN_DIR)]))
    command = [sys.executable, *(["-c", code] if code else ["-m", "loom"]),
               *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True,
                          text=True, check=False, timeout=timeout)


def test_the_blocker_blocks(tmp_path):
    result = _run(tmp_path, ["matplotlib", "torch"], [], code=(
        "from loom import _extras; "
        "print(_extras.missing(['matplotlib', 'torch', 'json']))"))
    assert result.stdout.strip() == "['matplotlib', 'torch']", result.stderr


def test_an_installed_wheel_names_the_extra():
    assert _extras.message(
        "loom demo", "drawing them", ["matplotlib"],
        outcome="pictures skipped", checkout=False) == (
            "loom demo: pictures skipped: drawing them needs matplotlib, "
            "which this Python cannot import (to get it: pip install "
            "'loom-alloc[plots]')")
    assert _extras.message("loom record-cpu", "recording a model",
                           ["torch", "transformers"], checkout=False) == (
        "loom record-cpu: recording a model needs PyTorch (torch) and "
        "transformers, which this Python cannot import (to get them: pip "
        "install 'loom-alloc[record]')")
    assert _extras.fix(["transformers"], checkout=False) == \
        "pip install 'loom-alloc[record]'"
    assert _extras.fix(["matplotlib", "torch"], checkout=False) == \
        "pip install 'loom-alloc[all]'"


def test_a_checkout_names_setup_and_the_modules():
    assert _extras.in_checkout()
    assert _extras.fix(["matplotlib"]) == \
        "./loom setup, or pip install matplotlib"
    assert _extras.fix(["torch", "transformers"], checkout=True) == \
        "./loom setup, or pip install torch transformers"


def test_every_optional_module_has_an_extra_that_brings_it():
    for module, (_, extra) in _extras.MODULES.items():
        assert any(r.startswith(module) for r in _extras.EXTRAS[extra])
        assert any(r.startswith(module) for r in _extras.EXTRAS["all"])
    setup = (PLUGIN_DIR / "packaging" / "setup.py").read_text()
    assert "name=_extras.DIST" in setup and "_extras.EXTRAS" in setup


def test_launcher_commands_are_listed_only_in_a_checkout():
    installed = cli.usage(checkout=False)
    checkout = cli.usage(checkout=True)
    for command in cli.LAUNCHER_ONLY:
        assert f"\n  {command} " not in installed
        assert f"\n  {command} " in checkout
        line = cli.launcher_only_message(command, checkout=False)
        assert "\n" not in line
        assert line.startswith(f"loom: '{command}' is a command of a loom "
                               f"source checkout (./loom {command} there): ")
    assert "pip install 'loom-alloc[all]'" in \
        cli.launcher_only_message("setup", checkout=False)


def test_compare_plot_without_matplotlib_prints_the_table_and_one_line(
        tmp_path, loom_tool):
    del loom_tool
    result = _run(tmp_path, ["matplotlib"], [
        "compare", "builtin:dense", "--loom-time-limit", "1", "--plot",
        "x.png"])
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("input: builtin:dense\n")
    assert "peak reserved" in result.stdout
    assert result.stderr.splitlines() == [_extras.message(
        "loom compare", "--plot", ["matplotlib"],
        outcome="x.png not written")]
    assert not (tmp_path / "x.png").exists()


_SMALL_DEMO = """import sys
from loom.tools import demo
demo.workloads = lambda: (demo.Workload("dense", "a generated dense run",
                                        "builtin:dense"),)
sys.exit(demo.main(sys.argv[1:]))
"""


def test_demo_without_matplotlib_prints_its_tables_and_skips_pictures(
        tmp_path, loom_tool):
    del loom_tool
    result = _run(tmp_path, ["matplotlib"],
                  ["--out", "pictures", "--time-limit", "1"],
                  code=_SMALL_DEMO)
    assert result.returncode == 0, result.stderr
    assert "=== dense: a generated dense run" in result.stdout
    assert "=== summary" in result.stdout
    assert "picture:" not in result.stdout
    assert result.stderr.splitlines() == [
        "loom demo: pictures skipped: drawing them needs matplotlib, which "
        "this Python cannot import (to get it: ./loom setup, or pip install "
        "matplotlib)"]
    assert not (tmp_path / "pictures").exists()


@pytest.mark.parametrize("block, missing", [
    (["torch"], ["torch"]),
    (["transformers"], ["transformers"]),
    (["torch", "transformers"], ["torch", "transformers"])])
@pytest.mark.parametrize("command", [
    ["record-cpu", "--model", "llama", "-o", "x.ltb"],
    ["what-if", "--model", "llama"]])
def test_the_recorder_without_torch_or_transformers_is_one_line(
        tmp_path, command, block, missing):
    result = _run(tmp_path, block, command)
    assert result.returncode == 1, result.stderr
    prog = f"loom {command[0]}"
    assert result.stderr.splitlines() == [
        _extras.message(prog, "recording a model", missing)]
    assert result.stdout == ""
    assert not (tmp_path / "x.ltb").exists()


def test_the_recorder_library_without_torch_says_how_to_get_it(tmp_path):
    result = _run(tmp_path, ["torch"], [], code=(
        "import loom\n"
        "try:\n"
        "    loom.record_cpu().start()\n"
        "except loom.LoomError as error:\n"
        "    print(error)\n"))
    assert result.stdout.strip() == _extras.message("loom", "record_cpu",
                                                    ["torch"]), result.stderr
