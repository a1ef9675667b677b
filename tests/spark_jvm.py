"""The JVM options of the Spark processes the tests start themselves: jobs run by Python or by
spark-submit, a standalone cluster's daemons and executors.

Such a JVM lives for one test and runs little data, and HotSpot's optimising compiler (C2)
spends much of its CPU compiling code it will not run for long. ``-XX:TieredStopAtLevel=1``
keeps the quick compiler (C1) alone: the log-level job of tests/test_pipelines.py (Python
running ``jobs/orders_pipeline.py``, 20 orders) took 0.62x and 0.66x the CPU time of its
process tree in two A/B pairs (load average ~20).

Most of the rest of a short JVM's start is loading, parsing and verifying Spark's classes from
its jars, the same classes in every JVM. A dynamic class-data-sharing archive (JDK 13+, CDS:
``-XX:ArchiveClassesAtExit`` writes the classes a JVM loaded, ``-XX:SharedArchiveFile`` maps
them into the next JVMs already parsed and verified) is made once per venv, JDK and set of
jars, by the first test that asks for these options (a small local job, ~25 s of CPU), and
kept beside the venv's jars' description in the venv (``<venv>/spark-cds/``). A job that
starts a local session and runs one query took 13.3/13.9/15.1 s of user CPU without it,
8.1/9.1/9.3 s with it (three interleaved pairs, load ~8-11). A JVM that cannot use the archive
(another class path) runs without it: its "unable to use shared archive" line is switched off
(``-Xlog:cds=off``), so a job's output is the same either way.

Speed only: no test checks anything that depends on the compiler or on where a class was
loaded from. (The session-wide ``spark`` fixture keeps the default compilers, its JVM runs the
whole Spark tier, and maps the archive.)
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

QUICK_COMPILER = "-XX:TieredStopAtLevel=1"

_PROBE = """
from jobs.spark import local_spark

spark = local_spark("filepulsar-tests-cds")
spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
spark.stop()
"""
"""What the archive is made from: a local session (the tests' settings) running a query with
a shuffle, the classes every test's JVM loads."""


def _java() -> Path:
    """The java binary spark-class runs (``$JAVA_HOME/bin/java``, else java on the path)."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else Path(shutil.which("java") or "java")
    return found.resolve()


def _archive_key(java: Path) -> str:
    """What the archive depends on: the JVM (its binary and libjvm) and Spark's jars (the
    JVM refuses an archive whose jars changed size or time)."""
    import pyspark

    parts = [str(java), sys.prefix]
    jvm = java.parent.parent / "lib" / "server" / "libjvm.so"
    jars = Path(pyspark.__file__).parent / "jars"
    for f in [java, jvm, *sorted(jars.glob("*.jar"))]:
        if f.exists():
            st = f.stat()
            parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _make_archive(path: Path) -> bool:
    """Run the probe job with ``-XX:ArchiveClassesAtExit``; the archive appears at ``path``
    only when the job and the dump succeeded."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="spark-cds-") as tmp:
        probe = Path(tmp) / "probe.py"
        probe.write_text(_PROBE)
        made = Path(tmp) / "spark.jsa"
        env = dict(
            os.environ,
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
            PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p),
        )
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        options = f"{QUICK_COMPILER} -XX:ArchiveClassesAtExit={made} -Xlog:cds=off"
        submit = Path(sys.executable).parent / "spark-submit"
        done = subprocess.run(
            [str(submit), "--master", "local[2]", "--driver-java-options", options, str(probe)],
            env=env,
            cwd=tmp,
            capture_output=True,
            timeout=600,
        )
        if done.returncode != 0 or not made.exists():
            return False
        os.replace(made, path)
        return True


@functools.cache
def class_data_options() -> str:
    """The JVM options that map the class-data archive (made on the first call, under a lock
    so that concurrent test runs make it once), or none when it cannot be made."""
    folder = Path(sys.prefix) / "spark-cds"
    archive = folder / f"{_archive_key(_java())}.jsa"
    try:
        folder.mkdir(exist_ok=True)
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not archive.exists():
                for old in folder.glob("*.jsa"):  # made for other jars or another JVM
                    old.unlink()
                if not _make_archive(archive):
                    return ""
    except OSError:  # a venv this user cannot write to: no archive, the JVMs start as before
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


def java_options() -> str:
    """The JVM options of a Spark JVM a test starts (a driver, an executor, a cluster
    daemon): the quick compiler and the class-data archive."""
    return f"{QUICK_COMPILER} {class_data_options()}".strip()


def driver_flags() -> list[str]:
    """spark-submit's flags for its driver JVM (the process spark-submit runs)."""
    return ["--driver-java-options", java_options()]


def executor_flags() -> list[str]:
    """spark-submit's flags for the executors a cluster starts for the application."""
    return ["--conf", f"spark.executor.extraJavaOptions={java_options()}"]


def submit_args(*flags: str) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for a Python process that starts its own Spark JVM (a job run
    by Python, the demo, a notebook kernel): spark-submit ``flags``, then the driver's JVM
    options."""
    return " ".join([*flags, "--driver-java-options", f'"{java_options()}"', "pyspark-shell"])
