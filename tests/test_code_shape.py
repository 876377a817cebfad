"""The package stays readable: no module over 500 lines, no function over 60 lines unless its docstring
says why (a sentence starting "Long:")."""

from __future__ import annotations

import ast
from pathlib import Path

import ones_pipeline

ROOT = Path(ones_pipeline.__file__).parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _files() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def long_functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function in ``path`` longer than the limit without a "Long:" reason."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                doc = ast.get_docstring(child) or ""
                if lines > MAX_FUNCTION_LINES and "Long:" not in doc:
                    out.append((f"{prefix}{child.name}", lines))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return out


def test_no_module_over_the_limit():
    big = {str(p.relative_to(ROOT)): n for p in _files() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"


def test_no_unexplained_long_function():
    long = {str(p.relative_to(ROOT)): fs for p in _files() if (fs := long_functions(p))}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines without a 'Long:' reason: {long}"


def test_the_function_checker_finds_one(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(70))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n\n\ndef g():\n    '''Long: a table.'''\n{body}\n")
    assert long_functions(tmp_path / "m.py") == [("f", 71)]
