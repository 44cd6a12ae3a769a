"""`loom_tool replay --per-iteration`: each iteration's live and reserved
peaks, the memory held at its end, its driver calls and loom's plan
counters (whatif/sim/replay.h's IterationSummary, cli/replay_iterations.h),
on builtin:varlen served with the plan of another seed (its iterations
change shape: the plan does not fit its first ones and loses) and
builtin:eval (its evaluation steps get a re-plan)."""

import json
import subprocess


def replay(loom_tool, *args, workload="varlen"):
    done = subprocess.run(
        [str(loom_tool), "replay", f"builtin:{workload}", "--plan-from",
         f"builtin:{workload}:seed=2", "--time-limit", "5", "--per-iteration",
         *args],
        capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_iterations_add_up_to_the_run(loom_tool):
    # With the re-planner, as compare runs loom.
    run = json.loads(replay(loom_tool, "--json", "--replan"))
    its = run["iterations"]
    assert [it["iteration"] for it in its] == list(range(8))
    # The run's peaks are reached inside its iterations (the set-up holds
    # only the weights).
    assert max(it["peak_reserved_bytes"] for it in its) == \
        run["peak_reserved_bytes"]
    assert max(it["peak_allocated_bytes"] for it in its) == \
        run["peak_allocated_bytes"]
    for it in its:
        assert it["peak_allocated_bytes"] <= it["peak_reserved_bytes"]
        assert it["reserved_at_end_bytes"] <= it["peak_reserved_bytes"]
    # The set-up's calls and hits come before iteration 0.
    assert 0 < sum(it["driver_calls"] for it in its) <= run["driver_calls"]
    assert 0 < sum(it["plan_hits"] for it in its) <= run["plan_hits"]
    assert sum(it["plan_misses"] for it in its) == run["plan_misses"]
    # Sequence lengths 2048, 4096, 1024, ...: the peak of a 4096 iteration
    # is twice a 2048 one's at least. The first iteration does not fit the
    # plan (suspended); its re-plan would hold more than loom held then
    # (refused), so the plan loses in the next one, and the dynamic space,
    # grown to the longest sequence, serves the rest with no call but 7 in
    # iteration 4 (since chunks are capped at 16 MiB under a plan too and
    # the arena stitches: 598 calls in iteration 1 and none after before).
    peaks = [it["peak_allocated_bytes"] for it in its]
    assert peaks[1] > 1.5 * peaks[0]
    assert its[0]["plan_suspensions"] > 0 and its[0]["plan_hits"] > 0
    assert run["replans_refused"] == 1
    assert [it["plan_losses"] for it in its] == [0, 1, 0, 0, 0, 0, 0, 0]
    assert sum(it["plan_hits"] for it in its[1:]) == 0
    assert [it["driver_calls"] > 0 for it in its[2:]] == \
        [False, False, True, False, False, False]
    assert its[4]["driver_calls"] <= 8


def test_table_has_a_line_per_iteration(loom_tool):
    out = replay(loom_tool)
    table = out.split("per iteration (counters")[1].splitlines()[2:]
    assert len(table) == 8
    assert table[0].split()[0] == "0" and table[7].split()[0] == "7"


def test_replan_replays_what_compare_measures(loom_tool):
    # --replan runs the re-planner as `loom compare`'s loom row does, so
    # the replay and the comparison see the same run: same peaks, same
    # driver calls, the same re-plans.
    run = json.loads(replay(loom_tool, "--json", "--replan", workload="eval"))
    done = subprocess.run(
        [str(loom_tool), "compare", "builtin:eval", "--plan-from",
         "builtin:eval:seed=2", "--loom-time-limit", "5", "--allocators",
         "loom", "--json"],
        capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)[0]
    assert run["peak_reserved_bytes"] == row["peak_reserved_bytes"]
    assert run["driver_calls"] == row["driver_calls"]["total"]
    assert run["replans"] == row["counters"]["replans"] >= 1
    assert run["plan_variants"] == row["counters"]["plan_variants"] >= 2
    # The iteration that installed it says so.
    assert sum(it["replans"] for it in run["iterations"]) == run["replans"]
    # Without --replan nothing is re-planned: one plan, throughout.
    plain = json.loads(replay(loom_tool, "--json", workload="eval"))
    assert "replans" not in plain
    assert sum(it["replans"] for it in plain["iterations"]) == 0
    assert max(it["plan_variants"] for it in plain["iterations"]) == 1
    assert max(it["plan_variants"] for it in run["iterations"]) >= 2


def test_replan_needs_a_plan(loom_tool):
    done = subprocess.run(
        [str(loom_tool), "replay", "builtin:varlen", "--replan"],
        capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 1
    assert "--replan re-plans around a plan" in done.stderr


def perturbed_dense(loom_tool, command, *args):
    """`loom_tool COMMAND builtin:dense` perturbed 10% (requests dropped,
    added and resized; planned from the unperturbed run), its JSON."""
    done = subprocess.run(
        [str(loom_tool), command, "builtin:dense", "--perturb",
         "drop=10%,add=10%,resize=10%,seed=1", "--json", *args],
        capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_then_repeat_appends_stationary_copies_of_the_last_iteration(
        loom_tool):
    # builtin:dense perturbed (10%: requests dropped, added and resized),
    # planned from the unperturbed run, then three copies of its last
    # iteration: the copies peak alike and loom settles (no driver call).
    def run(*extra):
        return perturbed_dense(loom_tool, "replay", "--self-plan", "--replan",
                               "--time-limit", "5", "--per-iteration",
                               *extra)["iterations"]

    alone = run()
    its = run("--then-repeat", "3")
    assert len(its) == len(alone) + 3
    # The input's own iterations are replayed as without the copies.
    assert [it["peak_allocated_bytes"] for it in its[:len(alone)]] == \
        [it["peak_allocated_bytes"] for it in alone]
    copies = its[len(alone):]
    assert [it["iteration"] for it in copies] == \
        list(range(len(alone), len(alone) + 3))
    assert len({it["peak_allocated_bytes"] for it in copies[1:]}) == 1
    assert copies[-1]["driver_calls"] == 0
    done = subprocess.run(
        [str(loom_tool), "replay", "builtin:dense", "--then-repeat", "-1"],
        capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 1 and "--then-repeat: -1 copies" in \
        done.stderr and ">= 0" in done.stderr


def test_compare_then_repeat_gives_every_allocator_the_same_copies(
        loom_tool):
    # `compare --then-repeat`: every allocator replays the same extended
    # trace (more events than the input), loom planned from the input as
    # without the copies; the steady state is the last copy's, and on this
    # perturbed run no allocator makes a call there.
    def rows(*extra):
        return {r["allocator"]: r for r in perturbed_dense(
            loom_tool, "compare", "--loom-time-limit", "2", *extra)}

    alone, repeated = rows(), rows("--then-repeat", "3")
    assert set(repeated) == set(alone)
    events = {r["events_replayed"] for r in repeated.values()}
    assert len(events) == 1 and events.pop() > alone["loom"]["events_replayed"]
    for name, r in repeated.items():
        assert r["steady_driver_calls_by_kind"]["total"] == 0, name
        assert r["peak_allocated_bytes"] >= alone[name]["peak_allocated_bytes"]
    assert repeated["loom"]["counters"]["steady_driver_calls"] == 0
