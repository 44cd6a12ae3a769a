"""The integration examples and the GPU scripts (they need torch and a GPU to
run): every use of the `loom` API in them exists in the package and binds to
its signature (so a renamed function or option breaks this test, not a GPU
run), and each example enables loom before torch is imported."""

import ast
import inspect
from pathlib import Path

import pytest

import loom
from loom import config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "torch_plugin" / "examples").glob("*.py"))
GPU_SCRIPTS = sorted((ROOT / "tests" / "gpu" / "python").glob("*.py")) + \
    sorted((ROOT / "bench" / "gpu" / "train").glob("*.py"))


def _imports_loom(tree):
    return any(isinstance(node, ast.Import) and
               any(alias.name == "loom" and alias.asname is None
                   for alias in node.names)
               for node in ast.walk(tree))


SCRIPTS = [p for p in EXAMPLES + GPU_SCRIPTS
           if _imports_loom(ast.parse(p.read_text()))]


def test_there_is_an_example_per_integration():
    names = {path.stem for path in EXAMPLES}
    assert {"plain_loop", "hf_trainer", "megatron_style",
            "torchrun_ddp"} <= names
    # The scripts checked below: every example and the GPU drivers.
    assert set(EXAMPLES) <= set(SCRIPTS)
    assert {"train_worker.py", "worker.py"} <= {p.name for p in SCRIPTS}


class _Uses(ast.NodeVisitor):
    """Every `loom.<name>` of a script, and every call `loom.<name>(...)`
    with its arguments; `**mapping` arguments are resolved to the items of
    the dict literals assigned to `mapping` in the same function."""

    def __init__(self):
        self.names = []   # (line, name)
        # (line, name, positional count, {keyword: value node or None})
        self.calls = []
        self._dicts = [{}]

    def _scope(self, node):
        dicts = {}
        for inner in ast.walk(node):
            if isinstance(inner, ast.Assign) and isinstance(inner.value,
                                                            ast.Dict):
                items = {k.value: v for k, v in zip(inner.value.keys,
                                                    inner.value.values)
                         if isinstance(k, ast.Constant)}
                for target in inner.targets:
                    if isinstance(target, ast.Name):
                        dicts.setdefault(target.id, {}).update(items)
        self._dicts.append(dicts)
        self.generic_visit(node)
        self._dicts.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Module = _scope

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "loom":
            self.names.append((node.lineno, node.attr))
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and \
                isinstance(func.value, ast.Name) and func.value.id == "loom":
            keywords = {}
            for keyword in node.keywords:
                if keyword.arg is not None:
                    keywords[keyword.arg] = keyword.value
                elif isinstance(keyword.value, ast.Name):
                    keywords.update(self._dicts[-1].get(keyword.value.id,
                                                        {}))
            positional = sum(1 for a in node.args
                             if not isinstance(a, ast.Starred))
            self.calls.append((node.lineno, func.attr, positional, keywords))
        self.generic_visit(node)


def _uses(path):
    uses = _Uses()
    uses.visit(ast.parse(path.read_text(), str(path)))
    return uses


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_loom_name_used_exists(path):
    uses = _uses(path)
    assert uses.names, f"{path.name} uses no loom API"
    for line, name in uses.names:
        assert not name.startswith("_"), (
            f"{path.name}:{line}: loom.{name} is not public API")
        assert name in loom.__all__ and hasattr(loom, name), (
            f"{path.name}:{line}: loom.{name} does not exist")


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_loom_call_binds_to_its_signature(path):
    for line, name, positional, keywords in _uses(path).calls:
        function = getattr(loom, name, None)
        assert callable(function), f"{path.name}:{line}: loom.{name}"
        signature = inspect.signature(function)
        try:
            signature.bind_partial(*[None] * positional,
                                   **dict.fromkeys(keywords))
        except TypeError as error:
            pytest.fail(f"{path.name}:{line}: loom.{name}(...): {error}")
        # enable() and pool() take the configuration as **options: those
        # must be options config.parse_config knows.
        named = {p.name for p in signature.parameters.values()
                 if p.kind is not p.VAR_KEYWORD}
        if name in ("enable", "pool"):
            unknown = [k for k in keywords if k not in named and
                       k not in config.option_names()]
            assert not unknown, (f"{path.name}:{line}: loom.{name}() has no "
                                 f"option {unknown[0]!r}")
            plan_options = keywords.get("plan_options")
            if isinstance(plan_options, ast.Dict):
                for key in plan_options.keys:
                    assert isinstance(key, ast.Constant) and \
                        key.value in config.PLAN_OPTIONS, (
                            f"{path.name}:{line}: plan_options has no "
                            f"{ast.unparse(key)}")


def test_the_api_check_catches_drift(tmp_path):
    """The checks above fail on a renamed function, a wrong keyword and an
    unknown option (also when passed through a **dict)."""
    script = tmp_path / "drift.py"
    script.write_text(
        "import loom\n"
        "def main():\n"
        "    options = {'record_iterations': 3, 'plan_args': ['-t']}\n"
        "    loom.enable(mode='auto', **options)\n"
        "    loom.watch(model, dynamc=['x'])\n"
        "    loom.memory_stat()\n")
    uses = _uses(script)
    assert ("memory_stat" in {n for _, n in uses.names} and
            not hasattr(loom, "memory_stat"))
    calls = {name: (positional, sorted(keywords))
             for _, name, positional, keywords in uses.calls}
    assert calls["enable"] == (0, ["mode", "plan_args", "record_iterations"])
    assert "plan_args" not in config.option_names()
    with pytest.raises(TypeError):
        inspect.signature(loom.watch).bind_partial(None, dynamc=None)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_enable_comes_before_torch(path):
    tree = ast.parse(path.read_text())
    enable = torch = None
    for node in tree.body:  # module level, in order
        text = ast.unparse(node)
        if enable is None and "loom.enable(" in text:
            enable = node.lineno
        if torch is None and isinstance(node, (ast.Import, ast.ImportFrom)) \
                and "torch" in text.replace("torch_plugin", ""):
            torch = node.lineno
    assert enable is not None, f"{path.name} never calls loom.enable()"
    assert torch is None or enable < torch, (
        f"{path.name}: torch imported (line {torch}) before loom.enable() "
        f"(line {enable})")
