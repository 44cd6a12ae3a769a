"""README's command-line examples run as written: every file they name is
one the repository ships, and each quick one succeeds, in order (the plan
the `plan` example writes is the one `verify` and `replay` read). They run
through the front end (`python -m loom`, what `./loom` runs once built) in
a scratch directory that sees the repository's bench/ at the same relative
path, so nothing is written into the repository."""

import os
import shlex
import subprocess
import sys

from loom import _paths

ROOT = _paths.REPO_ROOT
# Minutes of CPU recording or a build: run by their own tests
# (test_record_cpu.py, test_whatif_model.py, test_wheel.py).
SLOW = {"record-cpu", "what-if", "wheel"}


def _examples():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## What else the command line does"):]
    block = section[section.index("```sh\n") + 6:]
    block = block[:block.index("```")]
    commands = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("./loom"):
            commands.append(shlex.split(line)[1:])
    return commands


def test_the_examples_name_files_the_repository_ships():
    examples = _examples()
    assert len(examples) >= 10
    named = [arg for args in examples for arg in args
             if arg.startswith("bench/")]
    assert len(named) >= 6
    for path in named:
        assert (ROOT / path).is_file(), path


def test_the_quick_examples_run_as_written(tmp_path, loom_tool):
    del loom_tool  # built, or the test fails
    os.symlink(ROOT / "bench", tmp_path / "bench")
    env = {"PYTHONPATH": str(_paths.PACKAGE_DIR.parent),
           "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "HOME": str(tmp_path)}
    ran = []
    for args in _examples():
        if not args or args[0] in SLOW:
            continue
        result = subprocess.run([sys.executable, "-m", "loom", *args],
                                cwd=tmp_path, env=env, capture_output=True,
                                text=True, check=False, timeout=600)
        assert result.returncode == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr, args
        ran.append(args[0])
    assert {"analyze", "compare", "plan", "verify", "replay",
            "import"} <= set(ran)
    for output in ("out.png", "gpt2.lplan", "gpt2.ltt"):
        assert (tmp_path / output).stat().st_size > 0, output
    assert not list(ROOT.glob("gpt2.*"))  # nothing landed in the repository
