"""Configuration of `loom.enable()`: checking, libloom settings, file names.

`parse_config(mode, workdir, plan, device, **options)` turns the arguments
of `loom.enable()` into a checked `Config`, or raises `LoomError` naming
the option, the value and what is allowed. `settings_string(config)` is the
`loom_configure` text; it always names every key, because libloom keeps
settings from one configure call to the next.

Ranks (torchrun): `RANK` names the files, `LOCAL_RANK` the device;
`rank_info()` reads and checks them. Files of rank r in the work directory:
  trace.rank{r}.ltb (or .ltt)   the recorded trace
  trace.rank{r}.ltb.json        its fingerprint (loom.fingerprint)
  plan.rank{r}.lplan            the plan
  plan.rank{r}.lplan.json       which trace (fingerprint) it was planned from
"""

import dataclasses
import os
import re
from pathlib import Path

from loom.errors import LoomError

MODES = ("record", "plan", "auto")
BACKENDS = ("cuda", "host", "fake")
TRACE_FORMATS = {"binary": ".ltb", "text": ".ltt"}
PLAN_SUFFIX = ".lplan"
SIDECAR_SUFFIX = ".json"

# libloom's own defaults (torch_plugin/runtime.h), sent explicitly.
DEFAULT_GRANULARITY = 2 << 20
DEFAULT_DEVICE_MEMORY = 80 << 30
DEFAULT_RECORD_EVENTS = 4_000_000
MAX_RECORD_EVENTS = 1 << 32
MAX_DEVICES = 64
MAX_CHUNK_PAGES = 512
DEFAULT_HOST_SAMPLE_EVERY = 256
MAX_HOST_SAMPLE_EVERY = 1 << 20

_UNITS = {"": 0, "B": 0, "K": 10, "KiB": 10, "M": 20, "MiB": 20, "G": 30,
          "GiB": 30, "T": 40, "TiB": 40}
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*$")


@dataclasses.dataclass
class Config:
    """Everything `loom.enable()` was told, checked."""
    mode: str
    workdir: Path
    plan: Path = None            # plan file (plan mode: input; auto: output)
    device: int = None           # None: LOCAL_RANK, else torch's current one
    backend: str = "cuda"
    cap: int = 0                 # bytes, 0 = none
    fraction: float = 0.0        # of device memory, 0 = none
    record_events: int = 0       # trace buffer (events), 0 = no trace
    record_iterations: int = 3   # auto: iterations recorded before planning
    granularity: int = DEFAULT_GRANULARITY      # host/fake backends
    device_memory: int = DEFAULT_DEVICE_MEMORY  # host/fake backends
    devices: int = 1                            # host/fake backends
    trace_format: str = "binary"
    plan_options: dict = dataclasses.field(default_factory=dict)  # planner's
    plan_timeout: float = 600.0  # seconds to wait for another rank's plan
    plan_async: bool = True      # auto: plan in a background thread
    # Re-plan a shape of iteration no installed plan fits (libloom records
    # it and plans it as a new plan variant in the background). None: on
    # in auto mode, off otherwise.
    replan: bool = None
    # Serve a plan only if it earns its place: the check made with it (the
    # plan replayed on its recording with and without it, in the plan file
    # or libloom's planning report) must not show it holding more than loom
    # without a plan. False serves such a plan anyway.
    check_plan: bool = True
    planner: object = None       # callable(trace, plan) replacing libloom's
    reuse_plan_from: int = None  # a rank whose plan this rank may reuse
    # Auto mode across runs: serve, from the first request, the plan for a
    # whole run that an earlier run in this workdir made
    # (start-plan.rank{r}.lplan), and make that plan for the next run from
    # this run's recording (docs/plugin.md, "Auto mode across runs").
    remember: bool = False
    torch_stats: bool = True     # route torch.cuda.memory_stats() to loom
    atexit: bool = True          # finish() at interpreter exit
    # Physical layout: the largest handle, in granules (1..512; 512 = up to
    # 1 GiB at CUDA's 2 MiB). Smaller handles: more handles and mappings.
    max_chunk_pages: int = MAX_CHUNK_PAGES
    # From the second iteration on, where new memory would raise the memory
    # held above its peak, the dynamic space maps an idle chunk it holds
    # elsewhere a second time instead (stitching). False: it grows, as
    # loom did on the H200 on 2026-11-26.
    stitch: bool = True
    # One C ABI call in this many is timed ("loom.host.*" in memory_stats);
    # 0 = none, else a power of two.
    host_sample_every: int = DEFAULT_HOST_SAMPLE_EVERY


def parse_size(value, what):
    """Bytes from an int or a string like "40GiB" / "512M"."""
    if isinstance(value, bool):
        raise LoomError(f"{what}: expected a byte count, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise LoomError(f"{what}: {value} is negative")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2) in _UNITS:
            return int(match.group(1)) << _UNITS[match.group(2)]
        raise LoomError(f"{what}: {value!r} is not a byte count (examples: "
                        f"1048576, '512MiB', '40GiB')")
    raise LoomError(f"{what}: expected a byte count, got "
                    f"{type(value).__name__}")


def _int(value, what, low, high=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise LoomError(f"{what}: expected an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise LoomError(f"{what}: {value} is not in {bound}")
    return value


def _bool(value, what):
    if not isinstance(value, bool):
        raise LoomError(f"{what}: expected True or False, got {value!r}")
    return value


def _seconds(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not value > 0:
        raise LoomError(f"{what}: expected a positive number of seconds, "
                        f"got {value!r}")
    return float(value)


def _choice(value, what, choices):
    if value not in choices:
        raise LoomError(f"{what}: {value!r} is not one of "
                        f"{', '.join(map(repr, choices))}")
    return value


def _fraction(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 <= value <= 1:
        raise LoomError(f"fraction: {value!r} is not a number in [0, 1]")
    return float(value)


# The planner's options (plan/make_plan.h, ParseMakePlanOptions) and the
# Python types each takes; libloom checks the values again when it plans
# (algorithm and scope names, ranges) and a bad one fails that planning.
PLAN_OPTIONS = {
    "time_limit": "seconds", "capacity": "bytes", "granule": "bytes",
    "round": "bytes", "align": "bytes", "seed": "count", "period": "count",
    "steady_iteration": "iteration", "minimize": "bool", "persistent": "bool",
    "algorithm": "text", "scope": "text", "source": "text",
}


def _sample_every(value):
    _int(value, "host_sample_every", 0, MAX_HOST_SAMPLE_EVERY)
    if value & (value - 1):
        raise LoomError(f"host_sample_every: {value} is not 0 or a power of "
                        f"two")
    return value


def _plan_option(key, value):
    what = f"plan_options[{key!r}]"
    kind = PLAN_OPTIONS[key]
    if kind == "seconds":
        return _seconds(value, what)
    if kind == "bytes":
        return parse_size(value, what)
    if kind == "count":
        return _int(value, what, 0)
    if kind == "iteration":
        return _int(value, what, -1)
    if kind == "bool":
        return _bool(value, what)
    if not isinstance(value, str) or not value or any(c in value
                                                       for c in ";\n"):
        raise LoomError(f"{what}: expected a name, got {value!r}")
    return value


def _plan_options(value):
    if not isinstance(value, dict):
        raise LoomError(f"plan_options: expected a dict of planner options, "
                        f"e.g. {{'time_limit': 5}}, got {value!r}")
    checked = {}
    for key, option in value.items():
        if key not in PLAN_OPTIONS:
            raise LoomError(f"plan_options: unknown planner option {key!r} "
                            f"(options: {', '.join(sorted(PLAN_OPTIONS))})")
        checked[key] = _plan_option(key, option)
    return checked


def _planner(value):
    if value is not None and not callable(value):
        raise LoomError(f"planner: expected a callable(trace_path, plan_path),"
                        f" got {value!r}")
    return value


# option -> checker(value) -> checked value.
_OPTIONS = {
    "backend": lambda v: _choice(v, "backend", BACKENDS),
    "cap": lambda v: parse_size(v, "cap"),
    "fraction": _fraction,
    "record_events": lambda v: _int(v, "record_events", 0, MAX_RECORD_EVENTS),
    "record_iterations": lambda v: _int(v, "record_iterations", 1),
    "granularity": lambda v: parse_size(v, "granularity"),
    "device_memory": lambda v: parse_size(v, "device_memory"),
    "devices": lambda v: _int(v, "devices", 1, MAX_DEVICES),
    "trace_format": lambda v: _choice(v, "trace_format", tuple(TRACE_FORMATS)),
    "plan_options": _plan_options,
    "plan_timeout": lambda v: _seconds(v, "plan_timeout"),
    "plan_async": lambda v: _bool(v, "plan_async"),
    "replan": lambda v: _bool(v, "replan"),
    "check_plan": lambda v: _bool(v, "check_plan"),
    "planner": _planner,
    "reuse_plan_from": lambda v: v if v is None else _int(
        v, "reuse_plan_from", 0),
    "remember": lambda v: _bool(v, "remember"),
    "torch_stats": lambda v: _bool(v, "torch_stats"),
    "atexit": lambda v: _bool(v, "atexit"),
    "max_chunk_pages": lambda v: _int(v, "max_chunk_pages", 1,
                                      MAX_CHUNK_PAGES),
    "host_sample_every": _sample_every,
    "stitch": lambda v: _bool(v, "stitch"),
}
_HOST_ONLY = ("granularity", "device_memory", "devices")


def option_names():
    return sorted(_OPTIONS)


def parse_config(mode, workdir=".loom", plan=None, device=None, **options):
    """Checks `loom.enable()`'s arguments. Raises LoomError on the first bad
    one (unknown option, wrong type, out of range, contradiction)."""
    _choice(mode, "mode", MODES + ("pool",))  # "pool": loom.pool() only
    if "plan_args" in options:
        raise LoomError("plan_args is gone: the planner runs inside libloom "
                        "now; pass plan_options, a dict such as "
                        "{'time_limit': 5}")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise LoomError(f"unknown option {unknown[0]!r} (options: "
                        f"{', '.join(option_names())})")
    values = {name: _OPTIONS[name](value) for name, value in options.items()}
    backend = values.get("backend", "cuda")
    if backend == "cuda":
        for name in _HOST_ONLY:
            if name in values:
                raise LoomError(f"{name} applies to the host and fake backends "
                                f"only (CUDA reports its own)")
    if mode != "auto" and "record_iterations" in values:
        raise LoomError("record_iterations applies to mode='auto' only")
    if mode in ("record", "auto"):
        values.setdefault("record_events", DEFAULT_RECORD_EVENTS)
        if values["record_events"] == 0:
            raise LoomError(f"mode={mode!r} records a trace: record_events "
                            f"must be > 0")
    if device is not None:
        _int(device, "device", 0, 32767)
    if workdir is None or (not isinstance(workdir, (str, os.PathLike))):
        raise LoomError(f"workdir: expected a directory path, got {workdir!r}")
    if plan is not None and not isinstance(plan, (str, os.PathLike)):
        raise LoomError(f"plan: expected a file path, got {plan!r}")
    if values.get("replan") and mode in ("record", "pool"):
        raise LoomError(f"replan applies to modes that serve plans (auto, "
                        f"plan), not {mode!r}")
    values.setdefault("replan", mode == "auto")
    if values.get("remember") and mode != "auto":
        raise LoomError(f"remember applies to mode='auto' only (plan mode "
                        f"serves a plan file from the start already), not "
                        f"{mode!r}")
    if "check_plan" in values and mode in ("record", "pool"):
        raise LoomError(f"check_plan applies to modes that serve plans (auto, "
                        f"plan), not {mode!r}")
    config = Config(mode=mode, workdir=Path(workdir),
                    plan=Path(plan) if plan is not None else None,
                    device=device, **values)
    return config


def settings_string(config, device_count=None, plan=None):
    """The `loom_configure` text for `config`. `plan`: a plan installed on
    every device at its first use (plan mode). Host/fake backends get at
    least `device_count` devices."""
    devices = max(config.devices, device_count or 1)
    items = [
        ("backend", config.backend),
        ("granularity", config.granularity),
        ("device_memory", config.device_memory),
        ("devices", devices),
        ("cap", config.cap),
        ("fraction", repr(config.fraction)),
        ("record", config.record_events),
        ("plan", "" if plan is None else str(plan)),
        ("replan", 1 if config.replan else 0),
        ("max_chunk_pages", config.max_chunk_pages),
        ("host_sample_every", config.host_sample_every),
        ("stitch", 1 if config.stitch else 0),
    ]
    time_limit = config.plan_options.get("time_limit")
    if config.replan and time_limit is not None:
        items.append(("replan_time_limit", repr(float(time_limit))))
    for key, value in items:
        if any(c in str(value) for c in ";\n"):
            raise LoomError(f"{key}: {value!r} contains ';' or a newline, "
                            f"which libloom's settings cannot carry")
    return ";".join(f"{key}={value}" for key, value in items)


# ------------------------------------------------------------------- ranks

@dataclasses.dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    local_rank: int = None  # None: not launched by torchrun
    world_size: int = 1


def _env_int(environ, name):
    text = environ.get(name)
    if text is None or text.strip() == "":
        return None
    text = text.strip()
    if not text.isdigit() or not text.isascii() or len(text) > 6:
        raise LoomError(f"environment variable {name}={environ[name]!r} is "
                        f"not a rank number")
    return int(text)


def rank_info(environ=None):
    """RANK / LOCAL_RANK / WORLD_SIZE as torchrun sets them (all optional)."""
    environ = os.environ if environ is None else environ
    rank = _env_int(environ, "RANK")
    local = _env_int(environ, "LOCAL_RANK")
    world = _env_int(environ, "WORLD_SIZE")
    if world is not None and world < 1:
        raise LoomError(f"environment variable WORLD_SIZE={world} is not >= 1")
    if rank is not None and world is not None and rank >= world:
        raise LoomError(f"environment variable RANK={rank} is not below "
                        f"WORLD_SIZE={world}")
    return RankInfo(rank=rank or 0, local_rank=local,
                    world_size=world or 1)


def trace_path(workdir, rank, trace_format="binary"):
    return Path(workdir) / f"trace.rank{rank}{TRACE_FORMATS[trace_format]}"


def plan_path(workdir, rank):
    return Path(workdir) / f"plan.rank{rank}{PLAN_SUFFIX}"


def start_plan_path(workdir, rank):
    """Auto mode with remember=True: the plan of a whole run (persistent
    tensors included) made for the next run from this one's recording."""
    return Path(workdir) / f"start-plan.rank{rank}{PLAN_SUFFIX}"


def sidecar_path(path):
    """Where the fingerprint of a trace or plan file is kept."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


_RANK_FILE = re.compile(r"^(trace|plan)\.rank(\d+)\.(ltb|ltt|lplan)$")


def rank_of(path):
    """The rank in a loom file name (`plan.rank3.lplan` -> 3), or None."""
    match = _RANK_FILE.match(Path(path).name)
    return int(match.group(2)) if match else None


_START_PLAN = re.compile(r"^start-plan\.rank(\d+)\.lplan$")


def start_plan_rank(path):
    """The rank of a remembered whole-run plan's file name
    (`start-plan.rank3.lplan` -> 3), or None."""
    match = _START_PLAN.match(Path(path).name)
    return int(match.group(1)) if match else None
