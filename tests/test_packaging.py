"""The distribution installs one import package, ``filepulsar``, and the discovery module."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("connector", "storage", "dispatch", "jobs", "examples")


def _package_folders() -> set[str]:
    """``filepulsar.<dotted>`` of every folder with an ``__init__.py`` under the roots (each
    root is ``filepulsar.<root>``, setup.cfg's package_dir)."""
    return {
        ".".join(("filepulsar", *init.parent.relative_to(REPO).parts))
        for root in ROOTS
        for init in (REPO / root).rglob("__init__.py")
    }


def _listed_packages() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return set(cfg["options"]["packages"].split())


def test_setup_cfg_lists_every_package_folder() -> None:
    """setup.cfg lists packages by hand (the package_dir mapping rules out discovery), so a new
    sub-package would import in the editable install and be missing from the wheel."""
    folders = _package_folders()
    assert {"filepulsar.connector.client", "filepulsar.storage.blobstore"} <= folders
    assert folders - _listed_packages() == set(), "add these to setup.cfg [options] packages"
    assert _listed_packages() - folders == {"filepulsar"}


@pytest.mark.slow
@pytest.mark.procs
def test_the_wheel_holds_every_package_folder(built_wheel: Path) -> None:
    names = set(zipfile.ZipFile(built_wheel).namelist())
    missing = sorted(
        p for p in _package_folders() if p.replace(".", "/") + "/__init__.py" not in names
    )
    assert not missing, f"package folders not in the wheel: {missing}"
    for root in ROOTS:  # every module of every folder, not only the __init__
        for f in (REPO / root).rglob("*.py"):
            assert f"filepulsar/{f.relative_to(REPO).as_posix()}" in names


@pytest.mark.slow
@pytest.mark.procs
def test_the_wheel_holds_only_filepulsar_and_the_discovery_module(built_wheel: Path) -> None:
    wheel = built_wheel
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert top - dist_info == {"filepulsar", "pyspark_filepulsar.py"}
    for sub in ("connector", "storage", "dispatch", "jobs"):
        assert f"filepulsar/{sub}/__init__.py" in names
    assert "filepulsar/storage/manifest.py" in names
    assert not any("/tests/" in n or n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert (
        "filepulsar = filepulsar.jobs.cli:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )


@pytest.mark.slow
@pytest.mark.procs
def test_the_wheel_ships_the_example_notebook(built_wheel: Path, tmp_path: Path) -> None:
    """Issue #30: the example notebook is in the wheel (``filepulsar.examples``), and
    ``filepulsar notebook DIR``, run from the installed wheel alone, copies it out as it is
    in ``examples/``; an existing copy is kept unless ``--force``."""
    names = zipfile.ZipFile(built_wheel).namelist()
    assert "filepulsar/examples/topic_explorer.ipynb" in names
    site = tmp_path / "site"
    zipfile.ZipFile(built_wheel).extractall(site)  # what pip install puts in site-packages
    out = tmp_path / "notebooks"
    code = (
        "import sys, filepulsar\n"
        "from filepulsar.jobs.cli import main\n"
        "print(filepulsar.__file__)\n"
        "sys.exit(main(['notebook', *sys.argv[1:]]))\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(site)},
        )

    done = run(str(out))
    assert done.returncode == 0, done.stderr
    imported_from, wrote = done.stdout.splitlines()
    assert Path(imported_from).is_relative_to(site)  # the wheel's files, not the repository
    copied = out / "topic_explorer.ipynb"
    assert wrote.startswith(f"wrote {copied}")
    assert copied.read_bytes() == (REPO / "examples" / "topic_explorer.ipynb").read_bytes()
    copied.write_text("{}")
    again = run(str(out))
    assert again.returncode == 1 and "already exists" in again.stderr
    assert copied.read_text() == "{}"
    assert run(str(out), "--force").returncode == 0
    assert copied.read_bytes() == (REPO / "examples" / "topic_explorer.ipynb").read_bytes()


def test_the_public_entry_has_pulsar_client_names() -> None:
    import filepulsar
    from filepulsar.connector import client

    # The export list is written out in connector/__init__.py (so that importing the package
    # does not load the client) and in client.py: the two must not drift apart.
    assert sorted(filepulsar.__all__) == sorted(client.__all__)
    for name in filepulsar.__all__:
        assert getattr(filepulsar, name) is getattr(client, name)
    assert {"Client", "ConsumerType", "InitialPosition", "MessageId"} <= set(filepulsar.__all__)


@pytest.mark.procs
def test_no_generic_top_level_package_is_importable_from_outside_the_repository(
    tmp_path: Path,
) -> None:
    code = (
        "import importlib.util, sys\n"
        "bad = [n for n in ('connector', 'storage', 'dispatch', 'jobs') "
        "if importlib.util.find_spec(n) is not None]\n"
        "import filepulsar.storage, pyspark_filepulsar\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""
