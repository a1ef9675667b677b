"""``filepulsar notebook DIR``: copy the example notebook shipped with the package
(``filepulsar.examples``, package data) into a folder, to open it in Jupyter.

1. :func:`notebook_files` lists what is shipped, read through :mod:`importlib.resources`, so
   it works from a wheel, an editable install or a zip;
2. :func:`copy_notebooks` writes them, refusing to replace a file unless ``force``;
3. :func:`cmd_notebook` is the command (:mod:`filepulsar.jobs.cli`).
"""

from __future__ import annotations

import argparse
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from filepulsar.jobs.cli_support import EXIT_OK, print_done
from filepulsar.storage.errors import AlreadyExists

PACKAGE = "filepulsar.examples"


def notebook_files() -> list[Traversable]:
    """The ``.ipynb`` files shipped in :mod:`filepulsar.examples`, by name."""
    found = [f for f in resources.files(PACKAGE).iterdir() if f.name.endswith(".ipynb")]
    return sorted(found, key=lambda f: f.name)


def copy_notebooks(dest: str | Path, *, force: bool = False) -> list[Path]:
    """Copy the shipped notebooks into ``dest`` (created if missing); returns the paths written.

    Raises
    ------
    AlreadyExists
        If a notebook of the same name is already in ``dest`` and not ``force`` (nothing is
        written then: a notebook someone edited is not replaced by surprise).
    """
    folder = Path(dest)
    files = notebook_files()
    taken = [folder / f.name for f in files if (folder / f.name).exists()]
    if taken and not force:
        raise AlreadyExists(
            f"{', '.join(map(str, taken))} already exists; choose another folder or replace "
            "it with --force"
        )
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for f in files:
        target = folder / f.name
        target.write_bytes(f.read_bytes())
        written.append(target)
    return written


def cmd_notebook(args: argparse.Namespace) -> int:
    written = copy_notebooks(args.dir, force=args.force)
    print_done(
        args,
        "\n".join(f"wrote {p} (open it with: jupyter lab {p})" for p in written),
        written=[str(p) for p in written],
    )
    return EXIT_OK
