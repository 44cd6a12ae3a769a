"""The command-line front end, without torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from loom.tools import cli

PLUGIN_DIR = Path(__file__).resolve().parent.parent


def test_usage_lists_subcommands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "info" in out and "test" in out


def test_unknown_subcommand_is_a_usage_error(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown subcommand 'frobnicate'" in capsys.readouterr().err


def test_module_entry_point_runs_without_torch():
    result = subprocess.run([sys.executable, "-m", "loom", "--help"],
                            cwd=PLUGIN_DIR, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0
    assert "usage: loom" in result.stdout


def test_cli_does_not_import_torch():
    code = ("import sys, loom.tools.cli; loom.tools.cli.main(['--help']); "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=PLUGIN_DIR,
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("False")


def _subcommands():
    return sorted({*cli.FORWARDED, *cli.WRAPPED, *cli.PYTHON_COMMANDS})


@pytest.mark.parametrize("command", _subcommands())
def test_every_subcommand_has_help(command, loom_tool):
    del loom_tool  # forwarded subcommands run it: built, or the test fails
    result = subprocess.run([sys.executable, "-m", "loom", command, "--help"],
                            cwd=PLUGIN_DIR, capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: loom {command} "), result.stdout


@pytest.mark.parametrize("command", sorted(cli.LAUNCHER_ONLY))
def test_launcher_subcommands_have_help(command):
    result = subprocess.run([str(PLUGIN_DIR.parent / "loom"), command,
                             "--help"], capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: loom {command}")
    # Through Python they point at the launcher.
    assert cli.main([command]) == 2


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    listed = [line.split()[0] for line in
              capsys.readouterr().out.split("subcommands:\n")[1].splitlines()
              if line.startswith("  ")]
    assert sorted(listed) == sorted([*_subcommands(), *cli.LAUNCHER_ONLY])


def test_launcher_builds_before_every_subcommand_but_files():
    """import and export-snapshot read and write traces through libloom,
    so the launcher builds it first; only `files` needs no build."""
    text = (PLUGIN_DIR.parent / "loom").read_text()
    assert "\nPYTHON_ONLY=(files)\n" in text
