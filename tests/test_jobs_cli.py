"""The command line, run as a user would (in-process main(), real files)."""

from __future__ import annotations

import json
from typing import Any

from jobs.cli import main


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
