"""What Grove's code needs is what it declares: every third-party module a package of Grove imports
belongs to a distribution that ``pyproject.toml`` names, and the dependencies between Grove's own
packages point one way (``migrations`` → ``ledger``, never back)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("grove_errors", "ledger", "storage", "capture", "training", "grove", "migrations")
OWN = {*PRODUCT, "examples", "tests", "bench"}


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    """The absolute module names ``path`` imports (only those at module level, if asked)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _declared(*groups: str) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for group in groups:
        requirements += project["optional-dependencies"][group]
    return {canonicalize_name(Requirement(text).name) for text in requirements}


def _third_party(*, top_level_only: bool) -> dict[str, set[str]]:
    """Distribution name -> the files of Grove's packages that import one of its modules."""
    owners = packages_distributions()
    found: dict[str, set[str]] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in _imports(path, top_level_only=top_level_only):
                top = name.split(".")[0]
                if top in OWN or top in sys.stdlib_module_names or top == "__future__":
                    continue
                for distribution in owners.get(top, [f"<no installed distribution: {top}>"]):
                    found.setdefault(canonicalize_name(distribution), set()).add(
                        str(path.relative_to(ROOT))
                    )
    return found


def test_every_module_imported_at_load_time_is_a_declared_dependency():
    declared = _declared()
    undeclared = {
        name: sorted(files)
        for name, files in _third_party(top_level_only=True).items()
        if name not in declared
    }
    assert undeclared == {}


def test_every_module_imported_on_demand_is_declared_at_least_as_an_extra():
    declared = _declared("test")
    undeclared = {
        name: sorted(files)
        for name, files in _third_party(top_level_only=False).items()
        if name not in declared
    }
    assert undeclared == {}


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("ledger", "migrations"), ("migrations", "grove.ledger.migrate")],
)
def test_the_ledger_and_its_migrations_do_not_import_each_other(package: str, forbidden: str):
    importers = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if any(
            name == forbidden or name.startswith(f"{forbidden}.")
            for name in _imports(path, top_level_only=False)
        )
    )
    assert importers == []
