"""The package's folders are its architecture: lower layers never import higher ones,
llama.cpp is touched only by the engine and model management, and modules and functions
stay small. Read from the source with ast; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "edgeinfer"
# bottom to top; a module may import its own layer and the ones below it
LAYERS = ["config", "errors", "engine", "prompt", "models", "service", "api", "cli", "inprocess",
          "cluster"]
RANK = {"config": 0, "errors": 0, "engine": 1, "prompt": 2, "models": 3, "service": 4,
        "api": 5, "cli": 6, "inprocess": 6, "cluster": 6, "__main__": 7, "__init__": 0}
NATIVE_LAYERS = {"engine", "models"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names if node.module == "edgeinfer"]
    return out


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_higher_layer(path: Path) -> None:
    mine = RANK[_layer(path)]
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] != "edgeinfer" or len(parts) < 2 or parts[1] == "__version__":
            continue
        assert RANK[parts[1]] <= mine, f"{path.relative_to(PACKAGE)} imports {name}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_llama_cpp_only_under_engine_and_models(path: Path) -> None:
    if _layer(path) in NATIVE_LAYERS:
        return
    native = [n for n in _imports(path) if n.split(".")[0] == "llama_cpp"]
    assert not native, f"{path.relative_to(PACKAGE)} imports {native}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_are_small(path: Path) -> None:
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"{path.name}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{path.name}:{node.name} has {length} lines"


def test_every_layer_folder_exists() -> None:
    for layer in LAYERS:
        assert (PACKAGE / layer).is_dir() or (PACKAGE / f"{layer}.py").is_file(), layer
