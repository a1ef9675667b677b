"""Shared fixtures: a moto S3 server on loopback and a blob-store root on every backend.

``store_root`` is parametrised over local, memory and S3; ``-m "not s3"`` deselects the S3
case. Storage tests take ``store_root`` (a ``(root_url, storage_options)`` pair) or
``blob_store`` (the opened store).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.producer.io_thread import shared_io

_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never read a developer's real AWS configuration.
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


def _serialise_moto_object_writes(mp: pytest.MonkeyPatch) -> None:
    """Make moto's conditional object writes atomic, as S3's are.

    moto 5.2.5 checks ``If-None-Match: *`` and then stores the object as two steps, with no
    lock between them, in a threaded server: two racing PUTs can both pass the check, which
    real S3 never allows. One lock around moto's PutObject and CompleteMultipartUpload
    handlers closes that gap in the test double; the race tests then check that our client
    sends the condition and reads a 412 as "lost" (a client that sent no condition would see
    two winners).
    """
    from moto.s3.responses import S3Response

    lock = threading.Lock()
    for name in ("put_object", "_key_response_post"):
        handler = getattr(S3Response, name)

        @functools.wraps(handler)
        def locked(self: Any, *args: Any, _handler: Any = handler, **kwargs: Any) -> Any:
            with lock:
                return _handler(self, *args, **kwargs)

        mp.setattr(S3Response, name, locked)


def _memoise_moto_backend_lookup(mp: pytest.MonkeyPatch) -> None:
    """Look up moto's backend for a host once, not on every request.

    moto 5.2.5's server finds the service of each request by testing the host against the
    name of every folder of its package (a directory listing and ~200 ``isdir`` calls) and
    then every service's URL patterns, under one lock. The answer depends on the host alone,
    so one lookup per host gives every request the same backend; it halves the server's CPU
    per request (1.78 -> 0.88 ms, measured on the S3 producer race), which is most of what
    the multi-process S3 tests wait for on a 2-core machine.
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    lookup = DomainDispatcherApplication.get_backend_for_host
    found: dict[tuple[int, str | None], Any] = {}

    @functools.wraps(lookup)
    def memoised(self: Any, host: str | None) -> Any:
        key = (id(self), host)
        if key not in found:
            found[key] = lookup(self, host)
        return found[key]

    mp.setattr(DomainDispatcherApplication, "get_backend_for_host", memoised)


def _share_botocore_data_files(mp: pytest.MonkeyPatch) -> None:
    """Parse each of botocore's JSON data files once per process, not once per session.

    Every S3 store the tests open makes a botocore session of its own (s3fs's instance cache
    is off), and each new session parsed botocore's endpoint, S3 model and rule-set files
    again (3.5 MB of JSON): 130 of the 210 ms of CPU that opening a store and writing one
    blob took, and the tests open hundreds. botocore already hands one parsed copy to every
    client of a session (its loader caches it), so the clients of every session sharing it
    is the use botocore makes of it; what the client sends and reads is unchanged.
    """
    from botocore.loaders import JSONFileLoader

    load = JSONFileLoader.load_file
    found: dict[str, Any] = {}

    @functools.wraps(load)
    def shared(self: Any, file_path: str) -> Any:
        if file_path not in found:
            found[file_path] = load(self, file_path)
        return found[file_path]

    mp.setattr(JSONFileLoader, "load_file", shared)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 (a free port) for the session; yield its URL."""
    from moto.server import ThreadedMotoServer

    mp = pytest.MonkeyPatch()
    for name, value in _DUMMY_AWS_ENV.items():
        mp.setenv(name, value)
    mp.delenv("AWS_PROFILE", raising=False)
    _serialise_moto_object_writes(mp)
    _memoise_moto_backend_lookup(mp)
    _share_botocore_data_files(mp)
    # werkzeug logs every request; keep failures readable.
    werkzeug_log = logging.getLogger("werkzeug")
    werkzeug_level = werkzeug_log.level
    werkzeug_log.setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        werkzeug_log.setLevel(werkzeug_level)
        mp.undo()


@functools.cache
def _s3_client(endpoint_url: str) -> Any:
    """One boto3 client per moto server, for the fixtures' own calls (creating buckets)."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1")


@pytest.fixture
def s3_root(moto_s3: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Create a fresh bucket; yield ``("s3://bucket/root", storage_options)``."""
    bucket = f"test-{uuid.uuid4().hex[:24]}"
    _s3_client(moto_s3).create_bucket(Bucket=bucket)
    options = {
        "endpoint_url": moto_s3,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    yield f"s3://{bucket}/root", options


@pytest.fixture(
    params=["local", "memory", pytest.param("s3", marks=pytest.mark.s3)],
)
def store_root(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(root_url, storage_options)`` for a fresh, empty root on each backend."""
    if request.param == "local":
        yield str(tmp_path / "root"), {}
    elif request.param == "memory":
        root = f"memory://test-{uuid.uuid4().hex}"
        try:
            yield root, {}
        finally:
            # The memory filesystem is process-global: empty this test's namespace.
            store = open_blob_store(root)
            for directory in store.list_dirs(""):
                store.delete_prefix(directory)
            for key in store.list(""):
                store.delete(key)
    else:
        yield request.getfixturevalue("s3_root")


def s3_once(argname: str, values: Sequence[Any]) -> pytest.MarkDecorator:
    """Parametrise a test over ``store_root`` and ``argname``: every value on the local and
    memory stores, the first value on S3 too.

    For a parameter that changes what the test drives but not what it asks of the store (a
    random seed, a subscription type, a codec): what S3 adds (commits as conditional PUTs over
    HTTP, no folder watches, listings) one case per property shows, and an S3 case costs
    10-20 times the CPU of a local one in the no-JVM loop (the moto server runs in its
    process)."""
    cases: list[Any] = [(backend, v) for v in values for backend in ("local", "memory")]
    cases.append(pytest.param("s3", values[0], marks=pytest.mark.s3))
    return pytest.mark.parametrize(("store_root", argname), cases, indirect=["store_root"])


@pytest.fixture
def blob_store(store_root: tuple[str, dict[str, Any]]) -> BlobStore:
    """The blob store opened on ``store_root``."""
    root, options = store_root
    return open_blob_store(root, storage_options=options)


# --------------------------------------------------------------------------- Spark
@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once per session (offline: no build isolation). The
    repository's ``build/`` is removed first: setuptools reuses it, so a file an earlier build
    copied there (one since deleted or no longer packaged) would land in the wheel."""
    out = tmp_path_factory.mktemp("wheel")
    shutil.rmtree(Path(__file__).resolve().parents[1] / "build", ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(Path(__file__).resolve().parents[1]),
        ],
        check=True,
        cwd=out,
    )
    (wheel,) = out.glob("filepulsar-*.whl")
    return wheel


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole test session (local[2], few shuffle partitions,
    RocksDB state store for the stateful operators). Python workers use this interpreter.
    Its JVM maps the class-data archive of :mod:`tests.spark_jvm` (a quicker start) unless
    ``PYSPARK_SUBMIT_ARGS`` says how to start it."""
    from filepulsar.jobs.spark import local_spark
    from tests.spark_jvm import class_data_options

    mp = pytest.MonkeyPatch()
    options = "" if "PYSPARK_SUBMIT_ARGS" in os.environ else class_data_options()
    if options:
        mp.setenv("PYSPARK_SUBMIT_ARGS", f'--driver-java-options "{options}" pyspark-shell')
    try:
        session = local_spark(
            "filepulsar-tests", **{"spark.sql.execution.arrow.pyspark.enabled": "true"}
        )
    finally:
        mp.undo()  # (read once, when the JVM starts)
    try:
        yield session
    finally:
        session.stop()


TIERS = ("unit", "contract", "property", "golden", "spark", "procs")
"""The file tiers of ``setup.cfg`` (and the Makefile's ``TIERS``): one per test file."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes the ``spark`` fixture is in the spark tier whatever its file's tier,
    so ``-m "not spark"`` runs without a JVM, and marked ``spark_session`` (``make test`` runs
    those in a pytest of their own, one SparkSession, beside the others); a test marked
    ``procs`` (it starts child processes: kills, forks, the console script) is in the procs
    tier on top of its file's.

    Every test must be in exactly one file tier (spark or procs may come on top of it), or the
    tier targets would skip it while ``make test`` runs it: collection fails naming the tests
    that are in none or in several."""
    wrong: list[str] = []
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.spark_session)
        tiers = {m.name for m in item.iter_markers()} & set(TIERS)
        if len(tiers - {"spark", "procs"}) > 1 or not tiers:
            wrong.append(f"{item.nodeid} ({', '.join(sorted(tiers)) or 'no tier'})")
    if wrong:
        raise pytest.UsageError(
            f"{len(wrong)} tests are not in exactly one tier of {', '.join(TIERS)} "
            f"(set pytestmark in the file): " + "; ".join(wrong[:10])
        )


# The audit events (sys.addaudithook) of starting a child process.
_CHILD_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.exec"}
)
_PARENT = os.getpid()
_children: list[str] | None = None
"""What the running test started, while it is a test that must start none (else None)."""


def _note_child(event: str, args: tuple[Any, ...]) -> None:
    if _children is None or event not in _CHILD_EVENTS or os.getpid() != _PARENT:
        return
    if event == "subprocess.Popen" and str(args[0]).endswith("/ldconfig"):
        return  # ctypes.util.find_library("c"), once per process: the library's libc lookup
    _children.append(f"{event} {args[1] if len(args) > 1 else ''!r}"[:160])


sys.addaudithook(_note_child)


def _starts_no_child(item: pytest.Item) -> Iterator[None]:
    """Run a phase of ``item``; fail it when it started a child process and is a test of
    neither the procs nor the spark tier."""
    global _children
    if {m.name for m in item.iter_markers()} & {"procs", "spark"}:
        return (yield)
    _children = []
    try:
        result = yield
    finally:
        started, _children = _children, None
    if started:
        pytest.fail(
            "started a child process outside the procs tier (mark it procs): "
            + "; ".join(started[:3]),
            pytrace=False,
        )
    return result


_OPEN_BEFORE = pytest.StashKey["Counter[str]"]()
"""The producers the process's I/O thread served when the test's setup began."""
_FAILED = pytest.StashKey[bool]()
"""The test's setup or body raised (it may leave producers open: not reported again)."""


def _open_producers() -> Counter[str]:
    return Counter(shared_io().serving())


def _phase(item: pytest.Item) -> Iterator[None]:
    """Run the setup or the body of ``item`` (:func:`_starts_no_child`), noting whether it
    raised."""
    try:
        return (yield from _starts_no_child(item))
    except BaseException:
        item.stash[_FAILED] = True
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """A test outside the procs and spark tiers starts no child process (no fork, no
    subprocess), in its fixtures or its body, so ``-m "not spark and not procs"`` (the no-JVM
    loop) runs in its pytest processes alone: such a test fails, naming what it started.
    The producers open before it are noted (``pytest_runtest_teardown``)."""
    item.stash[_OPEN_BEFORE] = _open_producers()
    return (yield from _phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """See ``pytest_runtest_setup``."""
    return (yield from _phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """A test that passed closed every producer it opened (fenced ones too), once its
    fixtures are torn down: one left open stays on the process's I/O thread, which then
    outlives the last producer a later test closes (tests in a pytest-xdist worker share the
    process). Such a test errors at teardown, naming the producers."""
    result = yield
    if not item.stash.get(_FAILED, False) and _OPEN_BEFORE in item.stash:
        left = _open_producers() - item.stash[_OPEN_BEFORE]
        if left:
            pytest.fail(
                "left producers open on the process's I/O thread (close them): "
                + ", ".join(sorted(left.elements())),
                pytrace=False,
            )
    return result
