"""The command line, run as a user would (in-process main(), real files)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from filepulsar.jobs.cli import main, topic_stats
from filepulsar.storage import TopicNotFound, open_blob_store


def test_cli_round_trip(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    assert main(["--root", root, "topics", "create", "orders", "--partitions", "2"]) == 0
    assert (
        main(
            [
                "--root",
                root,
                "produce",
                "orders",
                "--key",
                "k1",
                "--property",
                "a=b",
                "hello",
                "world",
            ]
        )
        == 0
    )
    assert main(["--root", root, "topics", "list"]) == 0
    assert "persistent://public/default/orders\tpartitions=2" in capsys.readouterr().out
    assert main(["--root", root, "peek", "orders", "--count", "5"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["value"] for x in lines] == ["hello", "world"]
    assert lines[0]["key"] == "k1" and lines[0]["properties"] == {"a": "b"}
    assert main(["--root", root, "topics", "stats", "orders"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert sum(p["messages"] for p in stats["partitions"].values()) == 2
    assert (
        main(["--root", root, "policies", "set", "public/default", "retention_time_minutes=60"])
        == 0
    )
    assert main(["--root", root, "policies", "set", "public/default", "retention_days=1"]) == 2
    assert "unknown policy retention_days" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["--root", root, "retention", "--sweep-orphans"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["retention"]["managed_ledgers"] == 2 and report["orphans"]["deleted"] == []
    assert main(["--root", root, "retention", "orders", "--dry-run"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["orphans"]  # a dry run changes nothing
    assert main(["--root", root, "retention", "nope"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--root", root, "topics", "delete", "orders"]) == 0
    assert main(["--root", root, "topics", "stats", "orders"]) == 2


def test_cli_reports_bad_arguments_as_errors(tmp_path: Any, capsys: Any) -> None:
    """Malformed arguments give one ``error:`` line naming the argument, exit code 2, and
    change nothing."""
    root = str(tmp_path)
    assert main(["--root", root, "topics", "create", "t"]) == 0
    capsys.readouterr()
    cases = [
        (
            ["policies", "set", "public/default", "retention_time_minutes=abc"],
            "retention_time_minutes: value 'abc' is not JSON",
        ),
        (["policies", "set", "public/default", "retention_time_minutes"], "must be name=value"),
        (["produce", "t", "--property", "foo", "x"], "--property must be name=value, got 'foo'"),
        (["retention", "--orphan-min-age-hours", "-5"], "--orphan-min-age-hours must be"),
        (["retention", "--sweep-orphans", "--orphan-min-age-hours", "nan"], ">= 0, got nan"),
        (["peek", "t", "--start", "zz"], "--start: message id 'zz' is malformed"),
    ]
    for args, message in cases:
        assert main(["--root", root, *args]) == 2, args
        out, err = capsys.readouterr()
        assert err.startswith("error: ") and message in err and out == "", (args, err)
    for options in ["{bad", "[1]"]:
        assert main(["--root", root, "--storage-options", options, "topics", "list"]) == 2
        assert "--storage-options must be a JSON object" in capsys.readouterr().err
    # Nothing was produced and no policy was set.
    assert main(["--root", root, "topics", "stats", "t"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["partitions"]["persistent://public/default/t"]["messages"] == 0
    assert main(["--root", root, "policies", "get", "public/default"]) == 0
    assert json.loads(capsys.readouterr().out)["retention_time_minutes"] == 0
    # Well-formed versions of the same arguments work.
    assert (
        main(["--root", root, "retention", "--sweep-orphans", "--orphan-min-age-hours", "0"]) == 0
    )
    capsys.readouterr()
    assert (
        main(["--root", root, "--storage-options", "{}", "produce", "t", "--property", "k=", "x"])
        == 0
    )
    assert main(["--root", root, "peek", "t", "--start", "0:0:-1"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["properties"] == {"k": ""}


def test_cli_stats_of_a_missing_topic_says_so(tmp_path: Any, capsys: Any) -> None:
    with pytest.raises(TopicNotFound):  # not a bare FilePulsarError
        topic_stats(open_blob_store(str(tmp_path)), "nope")
    assert main(["--root", str(tmp_path), "topics", "stats", "nope"]) == 2
    err = capsys.readouterr().err
    assert err == "error: topic persistent://public/default/nope does not exist\n"
