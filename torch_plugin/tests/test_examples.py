"""The integration examples and GPU scripts (they need torch and a GPU to
run): they compile, and each enables loom before torch is imported."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "torch_plugin" / "examples").glob("*.py"))
GPU_SCRIPTS = sorted((ROOT / "tests" / "gpu" / "python").glob("*.py"))


def test_there_is_an_example_per_integration():
    names = {path.stem for path in EXAMPLES}
    assert {"plain_loop", "hf_trainer", "megatron_style",
            "torchrun_ddp"} <= names


@pytest.mark.parametrize("path", EXAMPLES + GPU_SCRIPTS,
                         ids=lambda p: p.name)
def test_compiles(path):
    compile(path.read_text(), str(path), "exec")


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
