"""The house in order: no module of the library over 400 lines, no function over 60."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("rayfl", "actors", "tune")


def sizes():
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            functions = [
                n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            yield (
                path.relative_to(ROOT),
                len(source.splitlines()),
                {f"{f.name}:{f.lineno}": f.end_lineno - f.lineno + 1 for f in functions},
            )


def test_no_module_over_400_lines_and_no_function_over_60():
    files = list(sizes())
    assert len(files) > 60
    assert [(str(path), lines) for path, lines, _ in files if lines > 400] == []
    assert [(str(path), name, n) for path, _, functions in files for name, n in functions.items() if n > 60] == []
