"""The code's comments and docstrings state contracts: no machine, date, session or measured
figure in ``src/`` (those live in ``benchmarks/RESULTS.md`` with their commands and JSON, and go
stale in code). Bounds (``>= 100 ms``) are contracts and stay. The package's public names resolve,
and the repository's own scripts take what they use of them from ``stormdrop`` itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import stormdrop

SRC = Path(__file__).resolve().parent.parent / "src" / "stormdrop"
MACHINES = re.compile(r"znver\d|rocketlake|skylake|cascadelake|sapphirerapids|EPYC|Xeon|Ryzen|Zen ?\d", re.I)
DATES = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b[Ss]ession \d+")
FIGURES = re.compile(r"(?<![<>=] )\b\d+(\.\d+)? ?(ms|us|GFLOPS|GB/s)\b|\b\d+(\.\d+)?x (faster|slower)\b")


def _lines():
    for path in sorted(SRC.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            yield f"{path.relative_to(SRC)}:{n}", line


def test_no_machine_date_or_session_in_the_source() -> None:
    bad = [f"{where}: {line.strip()}" for where, line in _lines() if MACHINES.search(line) or DATES.search(line)]
    assert not bad, "\n".join(bad)


def test_no_measured_figure_in_the_source() -> None:
    bad = [f"{where}: {line.strip()}" for where, line in _lines() if FIGURES.search(line)]
    assert not bad, "\n".join(bad)


def test_every_package_has_an_init_that_says_what_it_owns() -> None:
    """setuptools' package find skips a folder without ``__init__.py``: an installed (not editable)
    stormdrop would lack it. Each package's ``__init__.py`` opens with what the package owns."""
    import ast

    folders = {p.parent for p in SRC.rglob("*.py") if "__pycache__" not in p.parts}
    missing = [str(f.relative_to(SRC.parent)) for f in sorted(folders) if not (f / "__init__.py").is_file()]
    assert not missing, f"no __init__.py in {missing}"
    undocumented = [str(f.relative_to(SRC.parent)) for f in sorted(folders)
                    if not ast.get_docstring(ast.parse((f / "__init__.py").read_text()))]
    assert not undocumented, f"no docstring in the __init__.py of {undocumented}"


def test_the_tests_mirror_the_packages() -> None:
    """A package's tests sit in the folder of its name (``tests/search/`` for ``stormdrop.search``);
    only these project-wide checks sit at the top."""
    tests = Path(__file__).resolve().parent
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.parent.name for p in tests.rglob("test_*.py") if p.parent != tests}
    assert folders and folders <= packages, sorted(folders - packages)
    assert [p.name for p in tests.glob("test_*.py")] == [Path(__file__).name]


def test_every_public_name_resolves() -> None:
    from stormdrop.storage.database import Database
    from stormdrop.workloads.models import load_model

    for name in stormdrop.__all__:
        assert getattr(stormdrop, name) is not None, name
    assert stormdrop.load_model is load_model and stormdrop.open_database is Database


def test_scripts_import_public_names_from_the_package() -> None:
    """Public names come from ``stormdrop`` (or the public modules ``stormdrop.timing`` and
    ``stormdrop.target``), never from the private module that defines them; the model code that
    ``stormdrop.timing`` fronts (compiling, running and timing models and their peers) is reached only
    through it."""
    import stormdrop.timing

    public = set(stormdrop.__all__)
    fronted = {"stormdrop.model.run", "stormdrop.model.runtimes", "stormdrop.model.bench"}
    private, unknown = {}, {}
    for path in [*SRC.parent.parent.glob("benchmarks/*.py"), *SRC.parent.parent.glob("tools/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stormdrop"):
                names, where = {a.name for a in node.names}, f"{path.name}:{node.lineno}"
                if node.module == "stormdrop":
                    assert names <= public | {"stop"}, (path.name, names - public)
                elif node.module == "stormdrop.timing":
                    if names - set(stormdrop.timing.__all__):
                        unknown[where] = sorted(names - set(stormdrop.timing.__all__))
                elif node.module in fronted or names & (public - {"open_database"}):
                    private[where] = sorted(names)
    assert not private, private
    assert not unknown, unknown
