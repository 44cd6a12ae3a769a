"""`<repo>/loom <subcommand>` run from a directory outside the repository:
relative inputs and outputs are the caller's (import, analyze, plan, verify,
compare --json / --plot / --series, export-snapshot, what-if), nothing is
written into the repository, and a loom.py in the caller's directory does not
shadow the package. The launcher rebuilds nothing here (`./loom test` built
the tools before pytest runs), so each call costs Bazel's up-to-date check.
"""

import json
import os
import shutil
import subprocess
import uuid

from loom import _paths

ROOT = _paths.REPO_ROOT
LAUNCHER = ROOT / "loom"
SNAPSHOT = (ROOT / "bench" / "data" / "pytorch_snapshots" / "raw" /
            "magma27_small_ctx256_b32_fwd_bwd.pickle")
# Directories of the repository that are not its files.
_NOT_THE_TREE = {".git", ".venv", "__pycache__"}


def _launch(cwd, *args, timeout=600):
    env = dict(os.environ)
    env.pop("LOOM_LIB", None)
    env.pop("LOOM_TOOL", None)
    result = subprocess.run([str(LAUNCHER), *map(str, args)], cwd=cwd,
                            env=env, capture_output=True, text=True,
                            check=False, timeout=timeout)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def _repo_files_named(names):
    """Paths under the repository (its own files, not Bazel's output trees)
    whose name is one of `names`."""
    found = []
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in _NOT_THE_TREE
                      and not d.startswith("bazel-")]
        found += [os.path.join(directory, f) for f in files if f in names]
    return found


def test_relative_paths_are_the_callers(tmp_path, loom_tool):
    del loom_tool
    assert ROOT not in tmp_path.resolve().parents
    tag = uuid.uuid4().hex[:12]
    inputs, work = tmp_path / "in", tmp_path / "work"
    inputs.mkdir()
    work.mkdir()
    shutil.copy(SNAPSHOT, inputs / f"s-{tag}.pickle")
    # A module of the caller's that `python -m loom` would import instead.
    (work / "loom.py").write_text("raise SystemExit('the caller\\'s "
                                  "loom.py was imported')\n")
    snapshot = f"../in/s-{tag}.pickle"
    outputs = {name: f"{name.split('.')[0]}-{tag}.{name.split('.')[1]}"
               for name in ("t.ltt", "p.lplan", "o.csv", "m.png",
                            "series.csv", "back.pickle", "w.png")}

    _launch(work, "import", snapshot, "-o", outputs["t.ltt"])
    analyzed = json.loads(_launch(work, "analyze", snapshot, "--json").stdout)
    assert analyzed["allocs"] > 0
    planned = json.loads(_launch(
        work, "plan", outputs["t.ltt"], "-o", outputs["p.lplan"],
        "--offsets", outputs["o.csv"], "--time-limit", "1", "--json").stdout)
    assert planned["valid"] is True
    verified = _launch(work, "verify", outputs["p.lplan"], outputs["t.ltt"])
    assert verified.stdout.startswith("valid:")
    rows = json.loads(_launch(work, "compare", outputs["t.ltt"], "--json",
                              "--loom-time-limit", "1").stdout)
    assert {r["allocator"] for r in rows} >= {"pytorch", "loom"}
    _launch(work, "compare", outputs["t.ltt"], "--plot", outputs["m.png"],
            "--series", outputs["series.csv"], "--loom-time-limit", "1")
    _launch(work, "export-snapshot", outputs["t.ltt"], "-o",
            outputs["back.pickle"])
    _launch(work, "what-if", snapshot, "--plot", outputs["w.png"])

    for name in outputs.values():
        assert (work / name).stat().st_size > 0, name
    assert (work / outputs["m.png"]).read_bytes()[:4] == b"\x89PNG"
    assert (work / outputs["series.csv"]).read_text().startswith("allocator,")
    assert _repo_files_named(set(outputs.values())) == []


def test_help_and_setup_from_elsewhere(tmp_path):
    listing = _launch(tmp_path, "--help").stdout
    assert "record-cpu" in listing and "wheel" in listing
    setup = _launch(tmp_path, "setup")
    assert "python environment ready" in setup.stderr
    assert list(tmp_path.iterdir()) == []
