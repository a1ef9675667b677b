"""The README and the manual in docs/ stay true: the README short with links that resolve, no
machine-specific paths, and the cluster command of docs/deployment.md ("Way 2") built from
pieces that work (the ``--py-files`` artifact is one PySpark puts on the workers' path, the
driver's ``PYTHONPATH`` names it, and the zip made by the page's recipe imports the package).

``make docs`` (``mkdocs build --strict``) checks the links between the manual's pages; this
file checks what mkdocs does not see."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DEPLOYMENT = REPO / "docs" / "deployment.md"
#: Absolute paths that would only exist on the machine a page was written on.
MACHINE_PATHS = re.compile(r"(?<![\w.:/-])/(work|tmp|home|root|Users)/")


def _pages() -> list[Path]:
    return [README, REPO / "mkdocs.yml", *sorted((REPO / "docs").glob("*.md"))]


def _fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert "make demo" in text and "make test" in text
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links
    missing = [link for link in links if "://" not in link and not (REPO / link).exists()]
    assert missing == []


def test_no_page_names_a_machine_specific_path() -> None:
    hits = [
        f"{page.relative_to(REPO)}:{n}: {line.strip()}"
        for page in _pages()
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if MACHINE_PATHS.search(line)
    ]
    assert hits == []


def test_every_page_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages and all(re.search(rf":\s*{re.escape(name)}\s*$", nav, re.M) for name in pages)


def py_files_command() -> tuple[list[str], dict[str, str], list[str]]:
    """The documented "Way 2" block: its command lines (continuations joined), the variables
    it sets for spark-submit, and spark-submit's arguments."""
    (block,) = [b for b in _fenced_blocks(DEPLOYMENT.read_text()) if "--py-files" in b]
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    (submit,) = [line for line in lines if "spark-submit" in line]
    words = shlex.split(submit)
    at = next(i for i, w in enumerate(words) if w.endswith("spark-submit"))
    env = dict(w.split("=", 1) for w in words[:at])
    return lines, env, words[at + 1 :]


def test_the_cluster_command_ships_a_file_pyspark_puts_on_the_path() -> None:
    from pyspark import SparkContext

    lines, env, args = py_files_command()
    artifact = args[args.index("--py-files") + 1]
    # PySpark adds only these to the workers' sys.path; a .whl is shipped but not importable.
    assert Path(artifact).suffix in SparkContext.PACKAGE_EXTENSIONS
    # The streaming source is planned on the driver, which does not see --py-files.
    assert env["PYTHONPATH"] == artifact
    assert any(
        re.match(r"export PYSPARK_PYTHON=\S+ PYSPARK_DRIVER_PYTHON=", line) for line in lines
    )
    (build,) = [shlex.split(line) for line in lines if line.startswith("pip wheel")]
    wheel_dir = build[build.index("-w") + 1]
    (copy,) = [shlex.split(line) for line in lines if line.startswith("cp ")]
    assert copy[1] == f"{wheel_dir}/filepulsar-*.whl" and copy[2] == artifact
    script = next(a for a in args if a.endswith(".py"))
    assert (REPO / script).is_file()
    # The job's own arguments parse (the job registers the data source itself).
    from filepulsar.jobs import topic_to_files

    parsed = topic_to_files.parse_args(args[args.index(script) + 1 :])
    assert parsed.url.startswith("s3://") and parsed.checkpoint and parsed.path


@pytest.mark.slow
def test_the_documented_zip_imports_the_package_without_an_install(
    tmp_path: Path, built_wheel: Path
) -> None:
    """The page's recipe (the wheel copied to a .zip): a Python that has the dependencies but
    not filepulsar imports the package, the discovery module and the data source from it."""
    lines, _, args = py_files_command()
    artifact = args[args.index("--py-files") + 1]
    (copy,) = [shlex.split(line) for line in lines if line.startswith("cp ")]
    assert built_wheel.match(Path(copy[1]).name)
    (tmp_path / artifact).parent.mkdir(parents=True)
    shutil.copy(built_wheel, tmp_path / artifact)
    # -S: no site-packages and no .pth files, so the editable install's import hook is off;
    # site-packages itself comes back through PYTHONPATH for the dependencies alone.
    site_packages = sysconfig.get_paths()["purelib"]
    code = (
        "import filepulsar, pyspark_filepulsar\n"
        "from filepulsar.connector.datasource import FilePulsarDataSource\n"
        "print(filepulsar.__file__, FilePulsarDataSource.name())\n"
    )
    got = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env={"PYTHONPATH": f"{tmp_path / artifact}:{site_packages}", "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0, got.stderr
    where, name = got.stdout.split()
    assert where.startswith(str(tmp_path / artifact)) and name == "filepulsar"
