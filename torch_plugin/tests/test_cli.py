"""The command-line front end, without torch."""

import subprocess
import sys
from pathlib import Path

from loom import cli

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
    code = "import sys, loom.cli; loom.cli.main(['--help']); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=PLUGIN_DIR,
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("False")
