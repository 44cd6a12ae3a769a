#!/usr/bin/env bash
# The long stress run of loom's run-time allocator (stress/stress.h): seeds
# one after another, each for a slice of the total time, in the
# configurations that matter (several streams and threads, one stream, two
# devices, uncapped), on the async backend. Writes one JSON line per run to
# $OUT (default bench/results/stress/runs.jsonl) and prints the totals; exit
# status 1 if any run found a fault, a corrupted buffer or a broken
# invariant.
#
#   bench/stress/run_stress.sh [total seconds, default 600] [seconds per run, default 20]
#
# STRESS_EXTRA adds options to every run (e.g. "--driver-failures 10").
#
# Builds //cli:loom_tool first, unless LOOM_TOOL names a loom_tool binary.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOTAL="${1:-600}"
EACH="${2:-20}"
EXTRA="${STRESS_EXTRA:-}"
OUT="${OUT:-$ROOT/bench/results/stress/runs.jsonl}"
cd "$ROOT" || exit 1
if [[ -n "${LOOM_TOOL:-}" ]]; then
  TOOL="$LOOM_TOOL"
else
  bazel build --noshow_progress //cli:loom_tool >&2 || exit 1
  TOOL="$ROOT/bazel-bin/cli/loom_tool"
fi
CONFIGS=(
  ""                                      # 3 streams, 2 threads, cap, plan, graphs
  "--threads 4 --streams 4"
  "--streams 1 --threads 1"
  "--devices 2"
  "--cap 0"
  "--cap 6MiB --max-request 2MiB"
)
mkdir -p "$(dirname "$OUT")"
: > "$OUT"
start=$(date +%s)
seed=1
failed=0
while (( $(date +%s) - start < TOTAL )); do
  for config in "${CONFIGS[@]}"; do
    (( $(date +%s) - start < TOTAL )) || break
    # shellcheck disable=SC2086
    line="$("$TOOL" stress --backend async --seconds "$EACH" --seed "$seed" $config $EXTRA --json \
            | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))')"
    rc=$?
    echo "{\"config\": \"${config} ${EXTRA}\", \"result\": ${line:-null}}" >> "$OUT"
    [[ $rc -eq 0 ]] || failed=1
    seed=$((seed + 1))
  done
done
python3 - "$OUT" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
keys = ["ops", "kernels", "cross_stream_uses", "empty_caches", "ooms",
        "oom_retries", "plans_installed", "plan_hits", "graph_captures",
        "graph_replays", "driver_failures", "faults", "corrupted",
        "invariant_failures"]
total = {k: sum((r["result"] or {}).get(k, 0) for r in runs) for k in keys}
seconds = sum((r["result"] or {}).get("seconds", 0) for r in runs)
print(f"{len(runs)} runs, {seconds:.0f} s, seeds 1..{len(runs)}")
for k in keys:
    print(f"  {k:20} {total[k]:,}")
bad = [r for r in runs if not r["result"] or not r["result"]["ok"]]
print(f"runs with a problem: {len(bad)}")
PY
exit "$failed"
