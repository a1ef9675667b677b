"""One owner of paths: storage/paths.py builds and parses every storage key.

The parsers invert the builders, and no other module spells a layout folder or suffix in a
string it builds a key with (a scan of the source, so a new leak fails here).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from filepulsar.storage import paths
from filepulsar.storage.names import TopicName

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
T = TopicName.parse("persistent://acme/ns/orders-partition-1")


def test_builders_and_parsers_agree() -> None:
    for v in (0, 7, 10**19):
        key = paths.versioned_file("x/state", v)
        assert paths.manifest_version(key) == v and paths.turn_version(key) is None
        turn = paths.turn_file("x/state", v)
        assert paths.turn_version(turn) == v and paths.manifest_version(turn) is None
        assert paths.manifest(T, v) == paths.versioned_file(paths.manifest_dir(T), v)
    idx = paths.ledger_index(T, 12, 34, "abc123")
    assert paths.parse_ledger_index(idx) == (12, 34, "abc123")
    rel = paths.topic_relative(T, idx)
    assert paths.topic_key(T, rel) == idx and rel == idx.removeprefix(paths.topic_dir(T) + "/")
    with pytest.raises(ValueError):
        paths.topic_relative(T, paths.data_blob(TopicName.parse("other"), "s1"))
    assert paths.session_blob_id("ab12", 7) == "ab12-000007"
    assert paths.blob_id_of(paths.data_blob(T, paths.session_blob_id("ab12", 7))) == "ab12-000007"
    seg = paths.catalog_segment_name(1, 9, "ff")
    assert paths.topic_key(T, seg).startswith(paths.catalog_dir(T) + "/")
    assert paths.blob_id_of(paths.data_blob(T, "s1")) == "s1"
    assert paths.blob_id_of(paths.compaction_blob(T, "b1", paths.DATA_SUFFIX)) == "b1"
    assert paths.compaction_blob(T, "b1", paths.INDEX_SUFFIX).startswith(
        paths.compaction_data_dir(T) + "/"
    )
    with pytest.raises(ValueError):
        paths.compaction_blob(T, "b1", ".json")
    assert paths.schema_version_of(paths.versioned_file(paths.schema_dir(T), 3)) == 3
    assert paths.schema_version_of("a/b/policies.json") is None
    stem = paths.staged_blob_stem("w1", 5, 2, 0, "abcd")
    assert stem == "w1.5.2.0.abcd" and stem.startswith(paths.staged_blob_prefix("w1", 5))
    assert not paths.staged_blob_stem("w1", 50, 2, 0, "abcd").startswith(
        paths.staged_blob_prefix("w1", 5)
    )
    assert paths.tenant_marker("acme") == f"{paths.policy_tenant_dir('acme')}/tenant.json"
    assert paths.policy_namespace_dir("acme", "ns") + "/policies.json" == (
        paths.namespace_policies("acme", "ns")
    )
    assert paths.namespace_topics("persistent", "acme", "ns").startswith(
        paths.tenant_dir("persistent", "acme") + "/"
    )
    with pytest.raises(ValueError):
        paths.tenant_dir("persistent", "../x")
    for v in (0, 7, 10**19):
        name = paths.journal_segment(v)
        assert paths.journal_first(name) == v and paths.journal_first(f"x/state/{name}") == v
        assert paths.manifest_version(name) is None
        assert paths.journal_first(paths.versioned_file("x/state", v)) is None
        tmp = paths.journal_segment_temp(v, "ab12")
        assert tmp.startswith(f".{name}.") and tmp.endswith(paths.TMP_SUFFIX)
    assert paths.temp_name("00.json", "ff") == ".00.json.ff.tmp"
    assert paths.maintenance_lease_dir() == "maintenance/all/lease"
    assert paths.maintenance_lease_dir("acme") == "maintenance/tenants/acme/lease"
    assert paths.maintenance_lease_dir("acme", "ns") == "maintenance/namespaces/acme/ns/lease"
    with pytest.raises(ValueError):
        paths.maintenance_lease_dir("acme", "..")


# A string that builds a key: an f-string or literal naming a layout folder or suffix.
_LEAK = re.compile(
    r"""f?["'][^"'\n]*(?:\btopics/|(?<=[}\w])/data/|/ledgers/|/catalog/|/subscriptions/|/state["'/]|"""
    r"""/compaction|\{version:020d\}|\{first:020d\}|\.entries["']|\.index["']|\.turn["']|"""
    r"""\.journal["']|\bmaintenance/|\.tmp["'])"""
)


def test_no_module_but_paths_builds_a_storage_key() -> None:
    leaks = []
    for folder in ("storage", "connector", "dispatch", "jobs"):
        for f in sorted((ROOT / folder).rglob("*.py")):  # (sub-packages too)
            if f.relative_to(ROOT).as_posix() == "storage/paths.py":
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if _LEAK.search(code) and '"""' not in line and "``" not in line:
                    leaks.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert leaks == []
