"""A newcomer's mistakes on the command line (issue 24): each is answered in
one line that says what is wrong and what to do, with a fitting exit
status, through the Python front end as `./loom` runs it."""

import json
import subprocess
import sys

import pytest

from loom import _paths

GPT2 = _paths.REPO_ROOT / "bench" / "data" / "traces" / \
    "gpt2small_train_step.ltt"


@pytest.fixture(name="run")
def fixture_run(tmp_path, loom_tool):
    del loom_tool  # built, or the test fails

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "loom", *map(str, args)],
            capture_output=True, text=True, check=False, cwd=tmp_path,
            env={"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)}, timeout=300)
    return run


def test_verify_with_the_arguments_swapped_names_the_right_order(run,
                                                                 tmp_path):
    assert run("plan", GPT2, "-o", "gpt2.lplan", "--time-limit",
               "1").returncode == 0
    swapped = run("verify", GPT2, "gpt2.lplan")
    assert swapped.returncode == 2
    assert swapped.stdout == ""
    assert swapped.stderr == (
        f"loom verify: gpt2.lplan is a plan file and {GPT2} is not: the plan "
        f"comes first (loom verify gpt2.lplan {GPT2})\n")
    right = run("verify", "gpt2.lplan", GPT2)
    assert right.returncode == 0, right.stderr
    assert right.stdout.startswith("valid: 2609 buffers")
    assert (tmp_path / "gpt2.lplan").exists()


def test_replay_with_another_workload_s_plan_warns(run):
    assert run("plan", "builtin:dense", "-o", "dense.lplan", "--time-limit",
               "1").returncode == 0
    other = run("replay", GPT2, "--plan", "dense.lplan")
    assert other.returncode == 0, other.stderr
    assert "(hit rate 0.00%)" in other.stdout
    assert other.stderr == (
        f"loom replay: warning: no request matched the plan (hit rate "
        f"0.00%): was dense.lplan planned for another workload? (to plan this "
        f"trace: loom plan {GPT2} -o PLAN)\n")
    # The same as JSON: the warning on stderr, stdout stays JSON.
    as_json = run("replay", GPT2, "--plan", "dense.lplan", "--json")
    assert json.loads(as_json.stdout)["plan_hits"] == 0
    assert as_json.stderr.startswith("loom replay: warning: ")
    # Its own plan: no warning.
    assert run("plan", GPT2, "-o", "gpt2.lplan", "--time-limit",
               "1").returncode == 0
    own = run("replay", GPT2, "--plan", "gpt2.lplan")
    assert own.returncode == 0 and own.stderr == "", own.stderr
    assert "(hit rate 100.00%)" in own.stdout


def test_plan_into_a_missing_folder_says_why(run):
    result = run("plan", "builtin:dense", "-o", "/nonexistent/dir/x.lplan",
                 "--time-limit", "1")
    assert result.returncode == 1
    assert result.stderr == ("loom plan: /nonexistent/dir/x.lplan: cannot "
                             "create file: No such file or directory\n")
    # Inputs that are not there: the OS's reason too (exit status 1).
    assert run("verify", "no-such.lplan", GPT2).stderr == (
        "loom verify: no-such.lplan: cannot open file: No such file or "
        "directory\n")
    assert run("verify", "x.lplan", "no-such.ltb").stderr == (
        "loom verify: no-such.ltb: cannot open file: No such file or "
        "directory\n")


def test_a_bad_device_memory_names_the_flag_once(run):
    result = run("what-if", "--model", "llama", "--device-memory", "lots")
    assert result.returncode == 2
    assert result.stderr == (
        "loom what-if: argument --device-memory: 'lots' is not a byte count "
        "(examples: 1048576, '512MiB', '40GiB')\n")
    assert result.stderr.count("--device-memory") == 1


def test_import_json_is_the_summary(run, tmp_path):
    snapshot = _paths.REPO_ROOT / "bench" / "data" / "pytorch_snapshots" / \
        "raw" / "bcrafton_gpt2small_ctx64_b1_train_step.pickle"
    result = run("import", snapshot, "-o", "gpt2.ltb", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["output"] == "gpt2.ltb"
    assert summary["allocs"] == 2609
    assert (tmp_path / "gpt2.ltb").exists()


# ------------------------------------------------ numbers that must agree


def _iterations_line(text):
    return next(line for line in text.splitlines()
                if " events, " in line and " allocations, " in line)


def test_compare_counts_iterations_as_analyze_does(run):
    """GPT-2's snapshot has no markers: analyze detects 13 iterations, and
    compare (and so the demo) says the same, and how it knows."""
    analysis = json.loads(run("analyze", GPT2, "--json").stdout)
    assert analysis["iterations"] == 13
    assert analysis["iteration_source"] == "period"
    table = run("compare", GPT2, "--loom-time-limit", "1").stdout
    assert ", 13 iterations detected (no markers), " in \
        _iterations_line(table)
    marked = run("compare", "builtin:moe", "--loom-time-limit", "1").stdout
    assert ", 4 iterations, " in _iterations_line(marked)
    csv = _paths.REPO_ROOT / "bench" / "data" / "minimalloc" / "examples" / \
        "input.12.csv"
    whole = run("compare", csv, "--loom-time-limit", "1").stdout
    assert ", 1 iteration (no markers, no repetition: the whole trace), " in \
        _iterations_line(whole)


def test_commands_on_a_pickle_name_the_user_s_file(run):
    snapshot = _paths.REPO_ROOT / "bench" / "data" / "pytorch_snapshots" / \
        "raw" / "bcrafton_gpt2small_ctx64_b1_train_step.pickle"
    table = run("compare", snapshot, "--loom-time-limit", "1")
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith(f"input: {snapshot}\n")
    assert "loom-snapshot-" not in table.stdout + table.stderr
    replay = json.loads(run("replay", snapshot, "--json").stdout)
    assert replay["input"] == str(snapshot)
    planned = run("plan", snapshot, "-o", "s.lplan", "--time-limit", "1",
                  "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["input"] == str(snapshot)
    # The plan file itself records the snapshot as its source.
    shown = json.loads(run("plan", "s.lplan", "--json").stdout)
    assert shown["source"] == str(snapshot)
