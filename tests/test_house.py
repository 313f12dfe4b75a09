"""The house in order: no module of the library over 400 lines and no function over 60, counted as
`ruff format` (line length 120, pyproject.toml) writes them, so neither long lines nor a formatter
run can move the count."""

import ast
import subprocess
from pathlib import Path

from ruff.__main__ import find_ruff_bin

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("rayfl", "actors", "tune")


def formatted(path: Path) -> str:
    """The file as `ruff format` writes it (with the project's settings)."""
    out = subprocess.run(
        [find_ruff_bin(), "format", "--stdin-filename", str(path), "-"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return out.stdout


def sizes():
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = formatted(path)
            functions = [
                n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            lengths = {f"{f.name}:{f.lineno}": f.end_lineno - f.lineno + 1 for f in functions}
            yield path.relative_to(ROOT), len(source.splitlines()), lengths


def test_no_module_over_400_formatted_lines_and_no_function_over_60():
    files = list(sizes())
    assert len(files) > 60
    assert [(str(path), lines) for path, lines, _ in files if lines > 400] == []
    assert [(str(path), name, n) for path, _, functions in files for name, n in functions.items() if n > 60] == []


def test_the_count_is_of_formatted_lines(tmp_path):
    # one over-long call that the formatter spreads over several lines counts as those lines
    long = tmp_path / "long.py"
    long.write_text("f(" + ", ".join(f"argument_{k}" for k in range(40)) + ")\n")
    assert len(long.read_text().splitlines()) == 1 and len(formatted(long).splitlines()) > 5
