"""loom.enable(), loom.finish(), loom.status() and the process's session.

`enable()` is two steps, so that everything but the PyTorch hand-over is
testable without torch or a GPU:
  1. `_start(config)` (`loom._configure_native(...)` in tests): checks the
     configuration, resolves files per rank, configures libloom
     (`loom_configure`) and, in plan mode, installs the plan on this rank's
     device right away so that a bad plan is reported here and not as an
     OutOfMemoryError at the first tensor;
  2. with backend="cuda" only: `loom._torch.install` makes libloom the
     allocator of every CUDA tensor (CUDAPluggableAllocator +
     change_current_allocator, plus the optional hooks).
With backend="host" or "fake", libloom serves host memory and nothing is
handed to PyTorch (tests and demos drive loom_malloc/loom_free directly).
"""

import atexit
import logging

from loom import _native
from loom import _state
from loom import config as config_lib
from loom import planning
from loom.errors import LoomError, NativeError
from loom.session import Session

log = logging.getLogger("loom")

_atexit_registered = False


def _already_enabled():
    session = _state.current()
    raise LoomError(f"loom is already enabled in this process (mode="
                    f"{session.mode!r}); call loom.enable() once, first thing")


def _device_for(config, ranks):
    if config.device is not None:
        return config.device
    if ranks.local_rank is not None:
        return ranks.local_rank
    return 0


def _start(config, native_path=None):
    """Step 1 of enable(): configures libloom for `config`. Returns the new
    Session. Raises LoomError (and leaves nothing configured) on failure."""
    global _atexit_registered  # pylint: disable=global-statement
    with _state.lock:
        if _state.current() is not None:
            _already_enabled()
        ranks = config_lib.rank_info()
        device = _device_for(config, ranks)
        try:
            config.workdir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise LoomError(f"workdir {config.workdir}: cannot create: "
                            f"{error.strerror}") from None
        plan_file = plan_source = None
        if config.mode == "plan":
            plan_file, plan_source = planning.resolve_plan(config, ranks)
        native = _native.load(native_path)
        plan_check, declined = _recorded_check(config, native, plan_file,
                                               device)
        remembered = None  # auto mode, remember=True: an earlier run's plan
        if config.mode == "auto" and config.remember:
            remembered, why = planning.previous_start_plan(
                config, ranks.rank, native)
            if remembered is None:
                log.info("loom: nothing remembered to serve from the start "
                         "(%s): recording", why)
            else:
                plan_file, plan_source = remembered.plan, "previous run"
                plan_check = remembered.check
        _configure(native, config, device, None if declined else plan_file)
        session = Session(config, native, ranks, device, plan_file,
                          plan_source)
        session.plan_check = plan_check
        if declined:
            session.decline_plan_file()
        elif plan_file is not None:
            try:
                native.init_device(device)  # builds the allocator: loads the plan
            except NativeError as error:
                _shutdown_quietly(native)
                if remembered is None:
                    raise LoomError(f"cannot install plan {plan_file} on "
                                    f"device {device}: {error.message}"
                                    ) from None
                # Remembered, not asked for: record as auto mode does.
                log.warning("loom: cannot install the remembered plan %s on "
                            "device %d (%s): recording instead", plan_file,
                            device, error.message)
                _configure(native, config, device, None)
                session = Session(config, native, ranks, device)
                remembered = None
        if remembered is not None:
            session.serve_previous_plan(remembered.record)
        _state.set_current(session)
        if config.atexit and not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
        log.info("loom: %s mode, rank %d, device %d, backend %s", config.mode,
                 ranks.rank, device, config.backend)
        return session


def _configure(native, config, device, plan):
    """loom_configure for `config`, with `plan` installed on every device at
    its first use (None: no plan). Raises LoomError."""
    host = config.backend != "cuda"
    settings = config_lib.settings_string(
        config, device_count=device + 1 if host else None, plan=plan)
    try:
        native.configure(settings)
    except NativeError as error:
        if error.code == 4:  # FAILED_PRECONDITION: memory already served
            raise LoomError(
                "libloom is already serving memory in this process and "
                "cannot be reconfigured; enable loom once, first thing"
                ) from None
        raise LoomError(f"libloom rejected the settings: "
                        f"{error.message}") from None


def _recorded_check(config, native, plan_file, device):
    """Plan mode: the check recorded in the plan file when it was made
    (`loom plan`, or auto mode's planning: the plan replayed on its
    recording with and without it), and whether it declines the plan (it
    holds more there than loom without a plan, and check_plan is on).
    (None, False) without a plan file or a recorded check."""
    if plan_file is None:
        return None, False
    try:
        check = native.plan_file_check(plan_file)
    except NativeError as error:
        raise LoomError(f"cannot install plan {plan_file} on device "
                        f"{device}: {error.message}") from None
    declined = check is not None and not check["earns_its_place"] and \
        config.check_plan
    return check, declined


def _shutdown_quietly(native):
    try:
        native.shutdown()
    except LoomError:
        pass


def _configure_native(mode="auto", workdir=".loom", plan=None, device=None,
                      native_path=None, **options):
    """enable() without PyTorch: for the host/fake backends and tests."""
    config = config_lib.parse_config(mode, workdir, plan, device, **options)
    return _start(config, native_path)


def enable(mode="auto", workdir=".loom", plan=None, device=None, **options):
    """Makes loom the CUDA allocator of this process. Call it first thing,
    before anything touches the GPU. See docs/plugin.md for the modes and
    options. Returns status() (without the allocator figures)."""
    if mode not in config_lib.MODES:
        raise LoomError(f"mode: {mode!r} is not one of 'record', 'plan', "
                        f"'auto'")
    config = config_lib.parse_config(mode, workdir, plan, device, **options)
    if _state.current() is not None:  # before the torch checks, whose CUDA-
        _already_enabled()  # already-initialised message would mislead here
    if config.backend != "cuda":
        return _start(config).status(with_stats=False)
    from loom import _torch  # pylint: disable=import-outside-toplevel
    torch = _torch.ready_torch("loom.enable()")
    session = _start(config)
    try:
        _torch.install(torch, session,
                       set_device=config.device is not None or
                       session.ranks.local_rank is not None)
    except BaseException:
        _abandon(session)
        raise
    # Without stats: they would create an allocator on session.device, which
    # may not be the device this process goes on to use.
    return session.status(with_stats=False)


def _abandon(session):
    with _state.lock:
        if _state.current() is session:
            _state.set_current(None)
        _shutdown_quietly(session.native)


def finish(wait=True):
    """Ends recording: writes the trace (record mode, or auto mode before its
    switch) and waits for a running planner (`wait`). Also runs at exit.
    Returns status(). No-op without a session."""
    session = _state.current()
    if session is None:
        return None
    session.finish(wait=wait)
    return session.status()


def wait_for_plan(timeout=None):
    """Auto mode: blocks until a running planner has finished (or `timeout`
    seconds); its plan is installed at the next iteration boundary. Returns
    status(). For benchmarks and tests that want the switch at a known
    point; training never needs to wait."""
    session = _state.require("loom.wait_for_plan()")
    planner = session._planner  # pylint: disable=protected-access
    if planner is not None:
        planner.join(timeout)
    return session.status()


def status():
    """Where loom stands: mode, state, plan loaded and from where, hit rate
    of the last iteration, files, any planning error. None when loom is not
    enabled."""
    session = _state.current()
    return None if session is None else session.status()


def _at_exit():
    session = _state.current()
    if session is None or session.finished:
        return
    try:
        session.finish(wait=True)
    except Exception as error:  # pylint: disable=broad-except
        log.warning("loom: at exit: %s", error)


def _reset():
    """Forgets the session and shuts libloom down (tests; host/fake backends
    only). Raises LoomError while allocations are live or after the
    allocator was handed to PyTorch (which cannot take it back)."""
    with _state.lock:
        session = _state.current()
        if session is None:
            return
        if session.torch_allocator is not None:
            raise LoomError("loom is PyTorch's allocator in this process and "
                            "cannot be shut down")
        session.stop_planner()
        try:
            session.native.shutdown()
        except NativeError as error:
            raise LoomError(f"cannot shut loom down: {error.message}"
                            ) from None
        _state.set_current(None)
