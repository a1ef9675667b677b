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
from typing import Any

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
@pytest.mark.procs
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


def _python_blocks(page: Path, here: Path) -> list[str]:
    """The page's Python blocks, their relative paths (``"data/..."``, ``"chk"``) made absolute
    under ``here``: Spark's JVM and Python workers resolve relative paths against the JVM's
    working directory, which a test cannot move."""
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
    return [
        re.sub(r'"(data/[^"]*|chk)"', lambda m: repr(str(here / m.group(1))), b) for b in blocks
    ]


def test_the_readme_client_and_spark_starts_run_as_written(spark: Any, tmp_path: Path) -> None:
    """The client start publishes to ``orders``; the Spark start (on this session: its
    ``getOrCreate()`` returns it) copies the topic upper-cased to ``orders-upper``."""
    blocks = _python_blocks(README, tmp_path)
    (client_start,) = [b for b in blocks if "client.create_producer" in b]
    (spark_start,) = [b for b in blocks if "SparkSession.builder" in b]
    exec(compile(client_start, "README.md (client)", "exec"), {})
    exec(compile(spark_start, "README.md (Spark)", "exec"), {})
    root = str(tmp_path / "data/pulsar")
    copied = spark.read.format("filepulsar").option("topic", "orders-upper").load(root)
    assert [r.value for r in copied.selectExpr("cast(value as string) value").collect()] == [
        "HELLO"
    ]


@pytest.mark.slow
def test_the_dispatch_operators_pipeline_runs_as_written(spark: Any, tmp_path: Path) -> None:
    """docs/dispatch-operators.md's pipeline, after the retry topic is created as the page
    says: a duplicate (a replayed sequence id) is dropped, a failed message (null value) goes
    to the retry topic with RECONSUMETIMES 1, the rest reach the output topic with their
    Key_Shared consumer's rows."""
    from filepulsar import Client
    from filepulsar.admin import Admin
    from filepulsar.dispatch.spark import NO_DATA_BATCHES_CONF

    root = str(tmp_path / "data/pulsar")
    client = Client(root)
    producer = client.create_producer("orders")
    for i in range(10):
        producer.send(b"order-%d" % i, partition_key=f"k{i % 3}", sequence_id=i)
    producer.send(b"order-9", partition_key="k0", sequence_id=9)  # a retried send
    producer.send(None, partition_key="k1", sequence_id=10)  # fails the check
    client.close()
    Admin(root).topics().create_non_partitioned_topic("orders-sub-RETRY")
    (pipeline,) = _python_blocks(DEPLOYMENT.parent / "dispatch-operators.md", tmp_path)
    before = spark.conf.get(NO_DATA_BATCHES_CONF, None)
    try:
        exec(compile(pipeline, "docs/dispatch-operators.md", "exec"), {"spark": spark})
    finally:
        if before is None:
            spark.conf.unset(NO_DATA_BATCHES_CONF)
        else:
            spark.conf.set(NO_DATA_BATCHES_CONF, before)
    topics = Admin(root).topics()
    done = sorted(v.decode() for v in topics.read_table("orders-done").column("value").to_pylist())
    assert done == [f"order-{i}" for i in range(10)]
    retry = topics.read_table("orders-sub-RETRY").to_pylist()
    assert len(retry) == 1 and dict(retry[0]["properties"])["RECONSUMETIMES"] == "1"
