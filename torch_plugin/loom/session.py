"""The process's loom session: modes, iterations and the auto-mode switch.

One `Session` per process (libloom has one allocator per device and can be
configured once). It owns the markers (iterations, phases, modules) and the
state machine of the three modes:

  record:  recording ──finish(), or buffer nearly full──► recorded
                (trace.rank{r}.ltb + .json written at an iteration boundary)
  plan:    serving (the plan is installed on the device at enable())
           declined (the plan file's recorded check says it loses on its
                     own recording: served without it, unless
                     check_plan=False)
  auto:    recording ──N iterations──► planning ──plan ready──► planned
                                            │
                                            ├─ failure ──► fallback
                                            └─ the plan loses on its own
                                               iterations ──► declined
           remember=True with an earlier run's whole-run plan: planned
           from enable() on, recording N iterations to confirm it (or,
           when this run's requests differ, to plan the next run's)
  pool:    serving (loom.pool(): segments from PyTorch's caching allocator)

While recording, each iteration boundary checks the record buffer: when it
may not hold one more iteration, the trace is written there (record mode)
or planned from what it holds (auto mode), so a trace always ends with
complete iterations instead of overflowing.

In auto mode, at the end of iteration N (N = record_iterations, counted by
iteration ends: the first loom.step() ends iteration 0), the trace is
written, fingerprinted and planned by libloom in this process (no other
program runs), in a background thread unless plan_async=False; the
plan is installed at the next iteration boundary with `loom_load_plan`,
without a restart (allocations made while recording stay valid in loom's
dynamic space). Any planning failure is logged once as a warning, training
goes on as in record mode (everything served by the dynamic space), and
`status()["plan_error"]` says why. libloom replays the recorded iterations
with and without the plan it made (whatif/loom/plan_check.h): a plan that
holds more there than loom's dynamic space alone is not installed
(declined; `status()["plan_check"]` has both peaks), as a plan that would
cost memory on the very run it was made from.

Markers are emitted in a valid nesting: module exits that do not match the
innermost open module close the ones opened after it first, and exits of
modules that are not open are dropped (hooks that did not fire, e.g. after
an exception in forward, cannot corrupt the trace). All methods are
thread-safe (autograd hooks run on other threads). No torch here.
"""

import logging
import threading
from pathlib import Path

from loom import config as config_lib
from loom import fingerprint as fp
from loom import planning
from loom.errors import LoomError, NativeError

log = logging.getLogger("loom")

RECORDING = "recording"
PLANNING = "planning"
PLANNED = "planned"
FALLBACK = "fallback"
# Auto mode made a plan that does not earn its place on the iterations it
# was made from (it would hold more than loom without a plan there:
# whatif/loom/plan_check.h), or plan mode was given a plan file whose
# recorded check says so: training goes on without it.
DECLINED = "declined"
SERVING = "serving"
RECORDED = "recorded"


def _loses(check, recording):
    """How a declined plan's check reads in the log."""
    return (f"does not earn its place: on {recording} it holds "
            f"{check['planned_peak_reserved_bytes'] / 2**30:.2f} GiB at its "
            f"peak, loom without a plan "
            f"{check['unplanned_peak_reserved_bytes'] / 2**30:.2f} GiB")


class Session:
    """State of loom in this process. Created by loom.enable() (or
    loom._configure_native() in tests); see the module docstring."""

    def __init__(self, config, native, ranks, device, plan_file=None,
                 plan_source=None):
        self.config = config
        self.native = native
        self.ranks = ranks
        self.device = device
        self.mode = config.mode
        self.lock = threading.RLock()
        self.state = SERVING if self.mode in ("plan", "pool") else RECORDING
        self.iteration = 0         # number of the current (or next) iteration
        self.in_iteration = False
        self.completed = 0         # iterations ended so far
        self.modules = []          # open modules: [name, dynamic]
        self.finished = False
        self.trace_file = None
        self.plan_file = plan_file
        self.plan_source = plan_source
        self.plan_error = None
        self.plan_check = None     # the plan replayed on its recording
        self.record_error = None   # record mode: why the trace is missing
        self._events_seen = 0      # trace events at the last boundary
        self._max_iteration_events = 0
        self.torch_allocator = None  # CUDAPluggableAllocator, once installed
        self.torch_hooks = []
        self.torch_pool_allocator = None  # loom.pool(): its allocator
        self.torch_pools = {}             # loom.pool(): device -> MemPool
        self._planner = None       # background planning thread
        self._plan_result = None   # (plan path, source, check) or LoomError
        self._seen = {}            # plan-fit stats last logged
        self._stop = threading.Event()
        # Auto mode, remember=True: the sidecar record of the remembered
        # plan served from the start (None: none), and what this run's
        # recording said of it (status()["remembered"]).
        self._previous = None
        self.remembered = None
        self._verdict = None       # the verification's result, once ready

    # ------------------------------------------------------------ markers

    def begin_iteration(self):
        """Begins an iteration unless one is open."""
        with self.lock:
            if not self.in_iteration:
                self.native.iteration_begin(self.iteration)
                self.in_iteration = True

    def end_iteration(self):
        """Ends the current iteration (the implicit first one when none was
        begun), then takes the auto-mode transitions due at a boundary."""
        with self.lock:
            if self.in_iteration:
                self.native.iteration_end(self.iteration)
                self.in_iteration = False
            self.iteration += 1
            self.completed += 1
            if not self.finished:
                self._at_boundary()

    def step(self):
        """The current iteration ends and the next begins."""
        with self.lock:
            self.end_iteration()
            self.begin_iteration()

    def phase(self, name):
        self.native.phase(name)

    def module_enter(self, name, dynamic=False):
        with self.lock:
            self.modules.append((name, bool(dynamic)))
            self.native.module_enter(name, dynamic)

    def module_exit(self, name):
        with self.lock:
            for depth in range(len(self.modules) - 1, -1, -1):
                if self.modules[depth][0] == name:
                    while len(self.modules) > depth:
                        self.native.module_exit(self.modules.pop()[0])
                    return

    # ---------------------------------------------------------- auto mode

    def _at_boundary(self):
        if self._previous is not None:
            self._verify_previous_plan()
        if self.state == RECORDING:
            if self.mode == "auto" and \
                    self.completed >= self.config.record_iterations:
                self._start_planning()
            elif self._buffer_nearly_full():
                log.warning("loom: the trace buffer (record_events=%d) is "
                            "nearly full; the trace ends at iteration %d",
                            self.config.record_events, self.iteration)
                if self.mode == "auto":
                    self._start_planning()
                else:
                    self._write_recording()
        if self.state == PLANNING:
            self._install_if_ready()
        if self.state in (PLANNED, SERVING) and self.mode != "pool":
            self._watch_plan()

    def _watch_plan(self):
        """Says in the log when the plan did not fit an iteration (libloom
        then served it from its dynamic space) and when a re-plan of such an
        iteration was installed or failed."""
        try:
            stats = self.native.stats(self.device)
        except LoomError:
            return
        def grew(key):
            now = stats.get(key, 0)
            before = self._seen.get(key, 0)
            self._seen[key] = now
            return now > before
        if grew("loom.suspended_iterations"):
            n = stats.get("loom.suspended_iterations", 0)
            if n == 1 or n % 100 == 0:
                log.warning(
                    "loom: iteration %d did not fit the plan (%d iterations "
                    "so far): it was served by the dynamic space%s",
                    self.iteration - 1, n,
                    "; re-planning it" if self.config.replan else "")
        if grew("loom.plan_losses"):
            log.warning(
                "loom: the plan held %d MiB where the dynamic space alone "
                "would hold %d MiB: it stops serving (until a re-plan)",
                stats.get("loom.lost_plan_bytes", 0) >> 20,
                stats.get("loom.lost_dynamic_bytes", 0) >> 20)
        if grew("loom.replans"):
            log.info("loom: a plan variant for a new shape of iteration was "
                     "installed (%d variants)",
                     stats.get("loom.plan_variants", 0))
        if grew("loom.plan_variants_refused"):
            log.info("loom: a re-plan was not installed (%s); the iterations "
                     "it did not fit are served dynamically",
                     stats.get("loom.replan_error", "?"))
        if grew("loom.replan_failures"):
            log.warning("loom: re-planning failed: %s",
                        stats.get("loom.replan_error", "?"))

    # ------------------------------------------- auto mode across runs

    def serve_previous_plan(self, record):
        """Auto mode, remember=True: the plan an earlier run made for a whole
        run (`record`: its sidecar) was installed when loom was enabled and
        serves from the first request; this run still records its first
        `record_iterations` iterations, to confirm that plan or to make the
        next run's."""
        self.state = PLANNED
        self._previous = record
        self.remembered = "serving, to be confirmed"
        log.info("loom: serving the plan %s made by an earlier run from the "
                 "start", self.plan_file)

    def _verify_previous_plan(self):
        """At a boundary: once the recorded iterations are in, writes the
        trace and compares it (in the background) with the recording the
        remembered plan was made from; then says what it found. (No other
        planner thread runs in such a session: it never records to plan.)"""
        if self._planner is None:
            if self.completed < self.config.record_iterations and \
                    not self._buffer_nearly_full():
                return
            try:
                trace = self._write_trace_file()
            except LoomError as error:
                self._previous = None
                self.remembered = (f"unconfirmed: cannot write the "
                                   f"trace: {error}")
                self._stop_recording()
                log.warning("loom: %s", self.remembered)
                return
            if self.config.plan_async:
                self._planner = threading.Thread(
                    target=self._verify_job, args=(trace,), daemon=True,
                    name="loom-verify")
                self._planner.start()
                return
            self._verify_job(trace)
        verdict = self._verdict
        if verdict is None:
            return  # still running
        self._previous = None
        self._stop_recording()
        self.remembered = verdict
        if verdict == "confirmed":
            log.info("loom: this run's requests are those the remembered plan "
                     "was made from: it keeps serving")
        else:
            log.warning("loom: the remembered plan %s; it keeps serving where "
                        "it fits (iterations it does not fit are served "
                        "dynamically) and the next run gets a plan made from "
                        "this one", verdict)

    def _verify_job(self, trace):
        """Planner thread: fingerprints this run's trace; unless it equals
        the remembered plan's recording, makes the next run's plan from it."""
        try:
            fingerprint = self._fingerprint(trace)
            reason = fp.compare(fingerprint, self._previous["fingerprint"])
            if reason is None:
                verdict = "confirmed"
            else:
                verdict = f"differs from this run ({reason})"
                self._make_start_plan(trace, fingerprint)
        except LoomError as error:
            verdict = f"unconfirmed: {error}"
        except Exception as error:  # pylint: disable=broad-except
            verdict = f"unconfirmed: {type(error).__name__}: {error}"
        with self.lock:
            self._verdict = verdict

    def _make_start_plan(self, trace, fingerprint):
        """remember=True: plans `trace` as a whole run, persistent tensors
        included, into start-plan.rank{r}.lplan for the next run (with its
        check and the trace's fingerprint beside it)."""
        options = dict(self.config.plan_options)  # persistent: the default
        planning.plan_trace(
            trace, config_lib.start_plan_path(self.config.workdir,
                                              self.ranks.rank),
            fingerprint, planner=self.config.planner, options=options,
            rank=self.ranks.rank, native=self.native)

    def _buffer_nearly_full(self):
        """True when the record buffer may not hold one more iteration (the
        largest so far, twice), so the trace must be written at this
        boundary to end with complete iterations."""
        try:
            stats = self.native.stats(self.device)
        except LoomError:
            return False
        events = stats.get("loom.trace_events", 0)
        grown = events - self._events_seen
        self._events_seen = events
        self._max_iteration_events = max(self._max_iteration_events, grown)
        return stats.get("loom.trace_truncated", False) or (
            self.config.record_events - events < 2 * self._max_iteration_events)

    def _write_recording(self):
        """Record mode: writes the trace now; the fingerprint is computed in
        the background (reading a large trace back takes a while)."""
        try:
            trace = self._write_trace_file()
        except LoomError as error:
            self.record_error = str(error)
            self.state = FALLBACK
            log.warning("loom: cannot write the trace: %s", error)
            return
        self.state = RECORDED
        self._planner = threading.Thread(
            target=self._fingerprint_job, args=(trace,), daemon=True,
            name="loom-fingerprint")
        self._planner.start()

    def _fingerprint_job(self, trace):
        try:
            self._fingerprint(trace)
        except LoomError as error:
            with self.lock:
                self.record_error = str(error)

    def _start_planning(self):
        self.state = PLANNING
        try:
            trace = self._write_trace_file()
        except LoomError as error:
            self._fail(f"cannot write the trace: {error}")
            return
        if self.config.plan_async:
            self._planner = threading.Thread(
                target=self._plan_job, args=(trace,), daemon=True,
                name="loom-planner")
            self._planner.start()
        else:
            self._plan_job(trace)

    def _plan_job(self, trace):
        """Fingerprints, then reuses or makes a plan. Runs on the planner
        thread; its only effect on the session is _plan_result."""
        fingerprint = None
        try:
            fingerprint = self._fingerprint(trace)
            result = self._find_or_make_plan(trace, fingerprint)
        except LoomError as error:
            result = error
        except Exception as error:  # never let the planner thread die loudly
            result = LoomError(f"{type(error).__name__}: {error}")
        with self.lock:
            self._plan_result = result
        if self.config.remember and fingerprint is not None:
            # This run's plan was made for a switch mid-run; the next run
            # can be served from its start.
            try:
                self._make_start_plan(trace, fingerprint)
            except Exception as error:  # pylint: disable=broad-except
                log.warning("loom: no plan for the next run: %s", error)

    def _planner_options(self):
        """The planner's options for this session's own plan. In auto mode
        the plan is installed mid-run: the persistent tensors (weights,
        optimizer state) recorded before it already live in loom's dynamic
        space and stay there, so planning them too would hold their memory
        twice; the user's plan_options may still say otherwise."""
        options = dict(self.config.plan_options)
        if self.config.mode == "auto":
            options.setdefault("persistent", False)
        return options

    def _find_or_make_plan(self, trace, fingerprint):
        config, rank = self.config, self.ranks.rank
        source = config.reuse_plan_from
        if source is not None and source != rank:
            theirs = config_lib.plan_path(config.workdir, source)
            record = planning.wait_for_plan(theirs, config.plan_timeout,
                                            stop=self._stop.is_set)
            if record is None:
                log.warning("loom: rank %d: no plan from rank %d within %g s; "
                            "planning this rank's own", rank, source,
                            config.plan_timeout)
            else:
                reason = fp.compare(fingerprint, record["fingerprint"])
                if reason is None:
                    planning.check_plan_file(theirs)
                    return theirs, f"rank {source}", record.get("check")
                log.warning("loom: rank %d does not reuse rank %d's plan: %s",
                            rank, source, reason)
        plan = config.plan or config_lib.plan_path(config.workdir, rank)
        report = planning.plan_trace(
            trace, plan, fingerprint, planner=config.planner,
            options=self._planner_options(), rank=rank, native=self.native)
        if report.get("check_error"):
            log.warning("loom: the plan check could not run (%s); the plan "
                        "is installed unchecked", report["check_error"])
        return Path(plan), "own", report.get("check")

    def _install_if_ready(self):
        result = self._plan_result
        if result is None:
            return
        self._plan_result = None
        if isinstance(result, LoomError):
            self._fail(str(result))
            return
        plan, source, check = result
        self.plan_check = check
        if check is not None and not check.get("earns_its_place", True) \
                and self.config.check_plan:
            # On the very iterations it was made from the plan would hold
            # more than the dynamic space alone: not served.
            self.plan_file, self.plan_source = Path(plan), source
            self.state = DECLINED
            self._stop_recording()
            log.info("loom: the plan %s %s; training goes on without it",
                     plan, _loses(check, "the iterations it was made from"))
            return
        try:
            self.native.load_plan(self.device, str(plan))
        except LoomError as error:
            self._fail(f"cannot install {plan}: {error}")
            return
        self.plan_file, self.plan_source = Path(plan), source
        self.state = PLANNED
        self._stop_recording()
        log.info("loom: plan %s installed at iteration %d", plan,
                 self.iteration)

    def decline_plan_file(self):
        """Plan mode: the plan file's recorded check says it holds more on
        its own recording than loom without a plan (and check_plan is on):
        it is not installed, and everything is served dynamically."""
        self.state = DECLINED
        log.warning("loom: the plan %s %s; serving without it "
                    "(check_plan=False serves it anyway)", self.plan_file,
                    _loses(self.plan_check, "the run it was made from"))

    def _stop_recording(self):
        # The trace has served its purpose: stop filling the record buffer.
        try:
            self.native.stop_recording()
        except LoomError as error:
            log.warning("loom: could not stop recording: %s", error)

    def _fail(self, reason):
        self.state = FALLBACK
        self.plan_error = reason
        log.warning("loom: planning failed, training goes on without a plan "
                    "(every request served by loom's dynamic space): %s",
                    reason)

    # ------------------------------------------------------------- traces

    def _write_trace_file(self):
        """Writes this rank's trace (in config.trace_format); returns its
        path."""
        config = self.config
        trace = config_lib.trace_path(config.workdir, self.ranks.rank,
                                      config.trace_format)
        unused = LoomError(
            f"nothing to write to {trace}: device {self.device} served no "
            f"allocation (does the model run on device {self.device}? pass "
            f"loom.enable(device=N) otherwise)")
        try:
            if self.native.stats(self.device).get(
                    "allocation.all.allocated", 0) == 0:
                raise unused
            self.native.write_trace(self.device, str(trace))
        except NativeError as error:
            if "served no allocation" in error.message:
                raise unused from None
            raise
        self.trace_file = trace
        return trace

    def _fingerprint(self, trace):
        """Fingerprints the trace file just written (libloom reads it back)
        and writes its sidecar; returns the fingerprint."""
        try:
            fingerprint = fp.fingerprint_trace(trace, native=self.native)
        except LoomError as error:
            raise LoomError(f"cannot read back the recorded trace: {error}"
                            ) from None
        fp.write_sidecar(trace, fingerprint, rank=self.ranks.rank,
                         device=self.device, events=fingerprint["events"])
        return fingerprint

    # ------------------------------------------------------------ the end

    def finish(self, wait=True):
        """Ends recording duty: closes the open iteration; in record mode (or
        auto mode before its switch) writes the trace and its fingerprint.
        With `wait`, lets a running planner finish, so its plan is on disk
        for the next run (planning is bounded by the planner's time_limit,
        waiting for another rank's plan by plan_timeout). Idempotent; the
        allocator stays installed and markers keep working afterwards."""
        with self.lock:
            if self.finished:
                return
            if self.in_iteration:
                self.native.iteration_end(self.iteration)
                self.in_iteration = False
                self.iteration += 1
                self.completed += 1
            self.finished = True
            needs_trace = self.state == RECORDING
            planner = self._planner
        if needs_trace:
            self._fingerprint(self._write_trace_file())
            if self.mode == "record":
                self.state = RECORDED
        if planner is not None and wait:
            planner.join()
        elif planner is not None:
            self._stop.set()
        if self.record_error is not None:
            raise LoomError(f"no trace was recorded: {self.record_error}")

    def stop_planner(self, timeout=5.0):
        """Asks the planner thread to stop waiting and joins it (tests)."""
        self._stop.set()
        if self._planner is not None:
            self._planner.join(timeout)

    # ------------------------------------------------------------- status

    def status(self, with_stats=True):
        """A dict describing the session. `with_stats` reads the device's
        allocator stats, which creates the allocator if the device has not
        been used yet (enable() passes False)."""
        with self.lock:
            stats, stats_error = {}, None
            if with_stats:
                try:
                    stats = self.native.stats(self.device)
                except LoomError as error:  # e.g. no CUDA driver here
                    stats_error = str(error)
            hit_rate = stats.get("loom.last_iteration_hit_rate", -1)
            config = self.config
            files = {"workdir": str(config.workdir)}
            if self.trace_file is not None:
                files["trace"] = str(self.trace_file)
                files["trace_fingerprint"] = str(
                    config_lib.sidecar_path(self.trace_file))
            if self.plan_file is not None:
                files["plan"] = str(self.plan_file)
            return {
                "mode": self.mode,
                "state": self.state,
                "backend": config.backend,
                "rank": self.ranks.rank,
                "local_rank": self.ranks.local_rank,
                "world_size": self.ranks.world_size,
                "device": self.device,
                "iteration": self.iteration,
                "completed_iterations": self.completed,
                "recording": config.record_events > 0,
                "plan_loaded": bool(stats.get("loom.static_region_bytes", 0)),
                "plan_source": self.plan_source,
                # Auto mode, remember=True: the remembered plan served from
                # the start ("serving, to be confirmed", "confirmed",
                # "differs from this run (...)", "unconfirmed: ..."); None
                # when none was.
                "remembered": self.remembered,
                "plan_error": self.plan_error,
                # The plan replayed on the iterations it was made from, with
                # and without it (auto mode's, or the one recorded in plan
                # mode's plan file; "declined" when it loses).
                "plan_check": self.plan_check,
                "record_error": self.record_error,
                "hit_rate": None if hit_rate is None or hit_rate < 0
                else hit_rate,
                "plan_hits": stats.get("loom.plan_hits", 0),
                "plan_misses": stats.get("loom.plan_misses", 0),
                "plan_variants": stats.get("loom.plan_variants", 0),
                "suspended_iterations": stats.get(
                    "loom.suspended_iterations", 0),
                # The plan referee (issue 23): watching, confirmed, lost.
                "plan_verdict": stats.get("loom.plan_verdict", "none"),
                "plan_referee": {
                    "plan_bytes": stats.get("loom.referee_plan_bytes", 0),
                    "dynamic_bytes": stats.get(
                        "loom.referee_dynamic_bytes", 0),
                    "losses": stats.get("loom.plan_losses", 0),
                    "lost_plan_bytes": stats.get("loom.lost_plan_bytes", 0),
                    "lost_dynamic_bytes": stats.get(
                        "loom.lost_dynamic_bytes", 0),
                    # Requests served from the region's idle bytes while
                    # the plan did not serve (suspended or lost).
                    "region_reuses": stats.get("loom.region_reuses", 0),
                    # Persistent requests of an early iteration the plan
                    # did not fit, served at their planned place.
                    "persistent_placements": stats.get(
                        "loom.persistent_placements", 0),
                    # Persistent requests a little larger than their
                    # entry, at their planned offset all the same, and the
                    # later ones they pushed up.
                    "persistent_pushes": stats.get(
                        "loom.persistent_pushes", 0),
                },
                "replan": bool(config.replan),
                "replans": stats.get("loom.replans", 0),
                # Re-plans not installed: they would have raised the peak.
                "replans_refused": stats.get("loom.plan_variants_refused", 0),
                "replan_state": stats.get("loom.replan_state"),
                "replan_error": stats.get("loom.replan_error") or None,
                "torch_allocator": self.torch_allocator is not None,
                "torch_hooks": list(self.torch_hooks),
                "finished": self.finished,
                "stats_error": stats_error,
                "files": files,
            }
