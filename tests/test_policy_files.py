"""Policy files: framed and checked like the manifest; old plain-JSON files still read; errors
name the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from filepulsar.jobs.cli import main
from filepulsar.storage import (
    CorruptDataError,
    InvalidConfiguration,
    TopicName,
    effective_policies,
    open_blob_store,
    paths,
    set_namespace_policies,
    set_topic_policies,
)

pytestmark = pytest.mark.unit

T = TopicName.parse("orders")


def test_policy_files_are_framed_with_a_checksum(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path))
    set_topic_policies(store, "orders", retention_time_minutes=60)
    raw = store.get(paths.topic_policies(T.base))
    body, tail = raw.rstrip(b"\n").split(b"\n")
    assert json.loads(body) == {"retention_time_minutes": 60}
    assert tail.startswith(b"crc32c=") and len(tail) == 15
    assert effective_policies(store, T).retention_time_minutes == 60


def test_a_damaged_policy_file_fails_its_checksum_naming_the_file(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path))
    set_topic_policies(store, "orders", retention_time_minutes=60)
    key = paths.topic_policies(T.base)
    path = store.local_path(key)
    assert path is not None
    raw = Path(path).read_bytes()
    Path(path).write_bytes(raw.replace(b"60", b"90"))  # a flipped digit on disk
    with pytest.raises(CorruptDataError, match="checksum") as info:
        effective_policies(store, T)
    assert store.url(key) in str(info.value)


def test_plain_json_policy_files_of_older_versions_are_still_read(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path))
    # What this code wrote before policy files were framed.
    store.put(
        paths.namespace_policies("public", "default"),
        json.dumps({"message_ttl_seconds": 30}, indent=1, sort_keys=True).encode(),
    )
    assert effective_policies(store, T).message_ttl_seconds == 30
    set_namespace_policies(store, "public", "default", retention_size_mb=5)  # rewritten framed
    raw = store.get(paths.namespace_policies("public", "default"))
    assert b"\ncrc32c=" in raw
    p = effective_policies(store, T)
    assert (p.message_ttl_seconds, p.retention_size_mb) == (30, 5)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ({"retention_days": 1}, "unknown policy retention_days"),
        ({"retention_time_minutes": "sixty"}, "must be an integer"),
        ({"max_message_size": -1}, "must be > 0"),
        ({"max_message_size": 1 << 40}, "format's limit"),
        ([1, 2], "must hold a JSON object"),
    ],
)
def test_a_bad_policy_file_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: object, says: str
) -> None:
    store = open_blob_store(str(tmp_path))
    key = paths.namespace_policies("public", "default")
    store.put(key, json.dumps(content).encode())  # another tool, or an older version, wrote it
    with pytest.raises(InvalidConfiguration, match=says) as info:
        effective_policies(store, T)
    assert f"policy file {store.url(key)}" in str(info.value)
    assert "\n" not in str(info.value)
    assert main(["--root", str(tmp_path), "policies", "get", "orders"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and store.url(key) in err


def test_a_bad_value_is_refused_before_it_is_stored(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path))
    set_topic_policies(store, "orders", retention_time_minutes=60)
    with pytest.raises(InvalidConfiguration, match="nothing stored"):
        set_topic_policies(store, "orders", ledger_max_entries=0)
    assert effective_policies(store, T).retention_time_minutes == 60


def test_a_policy_file_read_again_after_a_change_or_a_caller_s_edit_is_the_stored_one(
    tmp_path: Path,
) -> None:
    """The process remembers policy files it parsed (by their bytes): a changed file is read
    as changed, another root's equal file as its own, and a caller changing the overrides it
    got changes nothing the next reader sees."""
    store = open_blob_store(str(tmp_path / "a"))
    set_topic_policies(store, "orders", retention_time_minutes=60)
    assert effective_policies(store, T).retention_time_minutes == 60
    set_topic_policies(store, "orders", retention_time_minutes=61)
    assert effective_policies(store, T).retention_time_minutes == 61
    set_namespace_policies(store, "public", "default", message_ttl_seconds=5)
    assert effective_policies(store, T).message_ttl_seconds == 5
    other = open_blob_store(str(tmp_path / "b"))
    set_topic_policies(other, "orders", retention_time_minutes=61)
    assert effective_policies(other, T).message_ttl_seconds == 0
    set_topic_policies(store, "orders", deduplication_enabled=True)  # (read, changed, written)
    assert effective_policies(store, T).retention_time_minutes == 61
    assert effective_policies(store, T).deduplication_enabled
    set_topic_policies(other, "orders", replace=True)
    assert effective_policies(other, T).retention_time_minutes == 0
    assert effective_policies(store, T).retention_time_minutes == 61
