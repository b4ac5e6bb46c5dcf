"""The wheel Grove ships owns its import names: built from the tree and installed into a fresh
virtual environment, it adds ``grove`` (with ``grove.ledger``, ``grove.storage``,
``grove.capture``, ``grove.training``, ``grove.migrations`` and ``grove.demo`` inside it) and
``grove_errors``, and no ``examples``, ``bench``, ``tests`` or bare layer name; its migrations
and its demo work from the installed package (``README.md``, "Install")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("grove", "grove_errors", "ledger", "storage", "capture", "training", "migrations")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site-packages of a fresh virtual environment holding only Grove's wheel."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    for name in SHIPPED:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("examples", "bench", "tests"):  # present in the tree, so leaving them out is shown
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source)],
        check=True,
        cwd=work,
    )
    (wheel,) = (work / "dist").glob("grove-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], check=True)
    return Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )


def _run_installed(site: Path, code: str, cwd: Path) -> dict:
    """Run ``code`` on the fresh environment's interpreter, with this environment's third-party
    packages on the path (a plain path entry: their ``.pth`` files, this checkout's editable
    finder among them, are not run), far from the checkout; returns the JSON it prints."""
    python = site.parents[2] / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": sysconfig.get_path("purelib")}
    result = subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True, cwd=cwd, env=env
    )
    return json.loads(result.stdout)


def test_the_wheel_installs_only_groves_own_top_level_names(installed: Path):
    names = {path.name for path in installed.iterdir() if not path.name.endswith(".dist-info")}
    assert names == {"grove", "grove_errors"}


def test_the_layers_install_inside_grove(installed: Path):
    assert sorted(
        p.name for p in (installed / "grove").iterdir() if (p / "__init__.py").exists()
    ) == [
        "capture",
        "commands",
        "config",
        "demo",
        "engines",
        "ledger",
        "migrations",
        "services",
        "storage",
        "tools",
        "train",
        "training",
    ]


def test_the_installed_migrations_bring_a_ledger_to_head(installed: Path, tmp_path: Path):
    found = _run_installed(
        installed,
        "import json, grove.ledger.migrate as m\n"
        f"url = 'sqlite:///{tmp_path / 'ledger.db'}'\n"
        "m.upgrade(url)\n"
        "print(json.dumps({'module': m.__file__, 'scripts': str(m.SCRIPT_LOCATION),\n"
        "    'current': m.current_revision(url), 'head': m.head_revision()}))",
        cwd=tmp_path,
    )
    assert Path(found["module"]).is_relative_to(installed)
    assert Path(found["scripts"]) == installed / "grove" / "migrations"
    assert found["current"] == found["head"] == "0006"


def test_the_installed_demo_configuration_names_the_installed_agent(
    installed: Path, tmp_path: Path
):
    found = _run_installed(
        installed,
        "import json\n"
        "from grove.config.loading import load_config\n"
        "from grove.demo import DEMO_CONFIG\n"
        "config = load_config(DEMO_CONFIG)\n"
        "print(json.dumps({'config': str(DEMO_CONFIG), 'target': config.harness.target,\n"
        "    'tasks': str(config.data.path)}))",
        cwd=tmp_path,
    )
    assert found["config"] == str(installed / "grove" / "demo" / "demo.yaml")
    assert found["target"] == "grove.demo.tool_agent:play"
    assert Path(found["tasks"]) == installed / "grove" / "demo" / "tool_tasks.jsonl"
