"""The layout of the `loom` package: the run-time plugin and the offline
tools (`loom.tools`), no import circle among its modules, and what importing
or using each part pulls in."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parent.parent
PACKAGE = PLUGIN_DIR / "loom"


def _module_name(path):
    parts = list(path.relative_to(PLUGIN_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
RUNTIME = sorted(m for m in MODULES if not m.startswith("loom.tools"))
TOOLS = sorted(m for m in MODULES if m.startswith("loom.tools"))


def _target(name):
    """The loom module an import of `name` loads: the module itself, or the
    package whose attribute it is."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module):
    """Every loom module `module` imports, wherever the import statement is
    (module level or inside a function: the issue's circle ran through
    imports inside functions), plus modules named by a string constant
    (importlib.import_module). The implicit import of a parent package
    (loom/__init__.py, which runs first) is not an edge."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else \
        module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value in MODULES and "." in node.value:
            names = [node.value]  # ("loom" alone is the logger's name)
        for name in names:
            target = _target(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _cycle():
    """A cycle of GRAPH as a list of modules, or None."""
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for other in sorted(GRAPH[module]):
            if state.get(other) == "open":
                return stack[stack.index(other):] + [other]
            if other not in state:
                found = visit(other)
                if found:
                    return found
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(GRAPH):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_package_is_split_into_runtime_and_tools():
    assert set(RUNTIME) == {
        "loom", "loom.__main__", "loom._extras", "loom._native", "loom._paths",
        "loom._state", "loom._torch", "loom.config", "loom.control",
        "loom.errors", "loom.fingerprint", "loom.integrations",
        "loom.markers", "loom.planning", "loom.session", "loom.stats"}
    assert set(TOOLS) == {
        "loom.tools", "loom.tools.cli", "loom.tools.compare_plot",
        "loom.tools.demo", "loom.tools.forward", "loom.tools.snapshot",
        "loom.tools.snapshot_cli", "loom.tools.snapshot_export",
        "loom.tools.snapshot_import", "loom.tools.trace",
        "loom.tools.whatif", "loom.tools.workdir_cli",
        "loom.tools.record_cpu", "loom.tools.record_cpu_cli",
        "loom.tools.record_modules", "loom.tools.record_summary",
        "loom.tools.record_markers", "loom.tools.fake_record",
        "loom.tools.cpu_models", "loom.tools.cpu_autocast",
        "loom.tools.predict", "loom.tools.whatif_model",
        "loom.tools.parallel_shapes", "loom.tools.peak_modules"}


def test_no_import_circle():
    assert _cycle() is None, " -> ".join(_cycle())
    # The circle issue 12 named is gone, and the graph is not empty.
    assert "loom.control" not in GRAPH["loom.stats"]
    assert "loom.stats" in GRAPH["loom._torch"]
    assert "loom._torch" in GRAPH["loom.control"]


def test_the_cycle_finder_finds_cycles():
    saved = dict(GRAPH)
    try:
        GRAPH["loom.stats"] = GRAPH["loom.stats"] | {"loom.control"}
        cycle = _cycle()
        assert cycle[0] == cycle[-1]
        assert {"loom._torch", "loom.stats", "loom.control"} <= set(cycle)
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_the_runtime_never_imports_the_tools_but_lazily():
    for module in RUNTIME:
        tools = {m for m in GRAPH[module] if m.startswith("loom.tools")}
        if module == "loom":  # export/import_snapshot, record_cpu, lazily
            assert tools == {"loom.tools.snapshot_export",
                             "loom.tools.snapshot_import",
                             "loom.tools.record_cpu"}
        elif module == "loom.__main__":
            assert tools == {"loom.tools.cli"}
        else:
            assert not tools, f"{module} imports {tools}"


_PROBE = """
import json, sys
import {module}
print(json.dumps(sorted(m for m in sys.modules
                        if m == "torch" or m.startswith(("loom", "torch.")))))
"""


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_alone_in_a_fresh_interpreter(module):
    """A module that only works once another one is loaded first would show
    here (an import circle fails with a partially initialised module)."""
    if module == "loom.__main__":
        return  # runs the command line when imported
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)], cwd=PLUGIN_DIR,
        capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert "torch" not in loaded, f"importing {module} imports torch"
    if module in RUNTIME:
        assert not [m for m in loaded if m.startswith("loom.tools")], (
            f"importing {module} imports the tools: {loaded}")


def test_offline_use_of_libloom_creates_no_allocator(tmp_path, libloom):
    """Reading, writing, fingerprinting and planning traces through libloom
    leave it unconfigured: loom.enable() can still configure it."""
    del libloom
    script = f"""
import loom
from loom import _native, fingerprint
from loom.tools import trace
t = trace.Trace(events=[trace.Event("iter_begin", id=0),
                        trace.Event.alloc(1, 4096), trace.Event.free(1),
                        trace.Event("iter_end", id=0)])
path = {str(tmp_path / "t.ltb")!r}
trace.write_trace(t, path)
assert trace.read_trace(path) == t
fingerprint.fingerprint_trace(path)
native = _native.load()
native.plan_trace(path, {str(tmp_path / "p.lplan")!r}, {{"time_limit": 1}})
assert native.stats(0)["reserved_bytes.all.current"] == 0
native.configure("backend=host;record=100")  # refused once memory is served
assert loom.status() is None
session = loom._configure_native(mode="record",
                                 workdir={str(tmp_path / "w")!r},
                                 backend="host", atexit=False)
print("configured", session.mode)
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=PLUGIN_DIR,
                            capture_output=True, text=True, check=False,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "configured record"
