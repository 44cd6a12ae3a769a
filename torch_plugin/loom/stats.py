"""loom.memory_stats(), reset_peak_memory_stats(), memory_summary().

The stats come from libloom (`loom_stats_json`): torch.cuda.memory_stats()
keys where the meaning matches (`allocated_bytes.all.current`,
`reserved_bytes.all.peak`, `num_ooms`, ...; loom has one pool, so only the
`all` breakdown) and loom's own under `loom.` (plan hits and misses, the
last iteration's hit rate, static and dynamic bytes, driver calls). Reserved
means physical memory held. With loom enabled, torch.cuda.memory_stats()
and the functions built on it (memory_allocated, max_memory_reserved, ...)
return these (see loom._torch.patch_stats).
"""

import collections

from loom import _state
from loom.errors import LoomError


def _device_index(device, session):
    """An int device from None / int / torch.device / "cuda:N"."""
    if device is None:
        return session.device
    if isinstance(device, bool):
        raise LoomError(f"device: {device!r} is not a device")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        text = device.strip()
        if text == "cuda":
            return session.device
        if not text.startswith("cuda:") or not text[5:].isdigit():
            raise LoomError(f"device: {device!r} is not 'cuda' or 'cuda:N'")
        index = int(text[5:])
    elif hasattr(device, "index"):
        if getattr(device, "type", "cuda") != "cuda":
            raise LoomError(f"device: {device!r} is not a CUDA device")
        index = session.device if device.index is None else device.index
    else:
        raise LoomError(f"device: {device!r} is not a device")
    if not 0 <= index <= 32767:
        raise LoomError(f"device: {index} is out of range")
    return index


def memory_stats(device=None):
    """loom's allocator stats for `device` (default: this rank's device), in
    torch.cuda.memory_stats() form: an OrderedDict sorted by key."""
    session = _state.require("loom.memory_stats()")
    stats = session.native.stats(_device_index(device, session))
    return collections.OrderedDict(sorted(stats.items()))


def reset_peak_memory_stats(device=None):
    """Sets every peak to its current value."""
    session = _state.require("loom.reset_peak_memory_stats()")
    session.native.reset_peak_stats(_device_index(device, session))


def format_size(size, preferred=None):
    """Bytes in torch.cuda.memory_summary()'s style: '  1023 B  ', '    12
    MiB' (the unit is chosen from `preferred`, so a row shares one unit)."""
    preferred = size if preferred is None else preferred
    prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if preferred < 768 * 1024:
            break
        prefix = new_prefix
        size //= 1024
        preferred /= 1024
    return f"{size:6d} {prefix}"


def format_count(count, preferred=None):
    preferred = count if preferred is None else preferred
    prefixes = [" ", "K", "M"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if preferred < 750 * 1000:
            break
        prefix = new_prefix
        count //= 1000
        preferred /= 1000
    return f"{count:7d} {prefix} "


_BYTE_ROWS = (
    ("allocated_bytes", "Allocated memory"),
    ("active_bytes", "Active memory"),
    ("requested_bytes", "Requested memory"),
    ("reserved_bytes", "Physical memory held"),
    ("loom.static_bytes", "  from the plan"),
    ("loom.dynamic_bytes", "  dynamic space"),
)
_COUNT_ROWS = (
    ("allocation", "Allocations"),
    ("segment", "Physical pages"),
)
_LOOM_ROWS = (
    ("loom.plan_hits", "Plan hits"),
    ("loom.plan_misses", "Plan misses"),
    ("loom.unplanned", "Unplanned requests"),
    ("loom.dynamic_requests", "Dynamic requests"),
    ("loom.iterations", "Iterations marked"),
    ("num_alloc_retries", "Allocation retries"),
    ("num_ooms", "Out-of-memory errors"),
    ("num_device_alloc", "Pages created"),
    ("num_device_free", "Pages released"),
    ("loom.driver_calls.total", "Driver calls"),
)
_WIDTH = 75


def _rule(char="-"):
    return "|" + char * _WIDTH + "|"


def _line(text):
    return "|" + text.ljust(_WIDTH)[:_WIDTH] + "|"


def _status_line(stats, session):
    rate = stats.get("loom.last_iteration_hit_rate", -1)
    rate_text = "n/a" if rate is None or rate < 0 else f"{100 * rate:.1f}%"
    plan = "yes" if stats.get("loom.static_region_bytes", 0) else "no"
    return (f" mode: {session.mode} ({session.state}) | plan loaded: {plan} | "
            f"last iteration hit rate: {rate_text}")


def memory_summary(device=None, abbreviated=False):
    """A readable table of memory_stats(), in the style of
    torch.cuda.memory_summary()."""
    session = _state.require("loom.memory_summary()")
    index = _device_index(device, session)
    stats = session.native.stats(index)
    head = f"{'Metric':^23}|{'Cur Usage':^12}|{'Peak Usage':^12}|" \
           f"{'Tot Alloc':^12}|{'Tot Freed':^12}"
    lines = [_rule("="),
             _line(f"loom memory summary, device ID {index}".center(_WIDTH)),
             _rule(),
             _line(_status_line(stats, session)),
             _rule("="),
             _line(head),
             _rule()]

    def stat_row(key, label, formatter):
        values = [stats.get(f"{key}.all.{k}", 0)
                  for k in ("current", "peak", "allocated", "freed")]
        cells = [formatter(v, values[1] if i < 2 else values[2])
                 for i, v in enumerate(values)]
        lines.append(_line(f" {label:<22}|" + "|".join(
            f" {c:<10} " for c in cells)))

    rows = _BYTE_ROWS if not abbreviated else _BYTE_ROWS[:4]
    for key, label in rows:
        stat_row(key, label, format_size)
    lines.append(_rule())
    for key, label in _COUNT_ROWS:
        stat_row(key, label, format_count)
    lines.append(_rule())
    static = stats.get("loom.static_region_bytes", 0)
    arena = stats.get("loom.arena_mapped_bytes", 0)
    lines.append(_line(f" {'Static region':<22}| {format_size(static)}   "
                       f"{'Dynamic space mapped':<21}| {format_size(arena)}"))
    if not abbreviated:
        lines.append(_rule())
        pairs = [(label, stats.get(key, 0)) for key, label in _LOOM_ROWS]
        for left, right in zip(pairs[0::2], pairs[1::2]):
            lines.append(_line(f" {left[0]:<22}| {left[1]:>10}   "
                               f"{right[0]:<21}| {right[1]:>10}"))
    lines.append(_rule("="))
    return "\n".join(lines) + "\n"
