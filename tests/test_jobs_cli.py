"""The command line, run as a user would: in-process ``main()`` on real files, and the
installed ``filepulsar`` console script as a real process (pipes, Ctrl-C)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from filepulsar import Client, InitialPosition
from filepulsar.admin import Admin
from filepulsar.jobs.cli import main
from filepulsar.storage import TopicNotFound

pytestmark = pytest.mark.unit


def _script() -> list[str]:
    """The installed console script next to this interpreter (else ``python -m``)."""
    exe = Path(sys.executable).with_name("filepulsar")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-P", "-m", "filepulsar.jobs.cli"]


def _env(root: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FILEPULSAR_URL", "FILEPULSAR_CONF")}
    if root:
        env["FILEPULSAR_URL"] = root
    env.update(extra)
    return env


def _run(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_round_trip(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    assert main(["--root", root, "topics", "create", "orders", "--partitions", "2"]) == 0
    assert (
        main(["--root", root, "produce", "orders", "--key", "k1", "--property", "a=b", "hello"])
        == 0
    )
    assert main(["topics", "list", "--url", root]) == 0  # options after the command too
    assert "persistent://public/default/orders\tpartitions=2" in capsys.readouterr().out
    assert main(["--root", root, "peek", "orders", "--count", "5"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["value"] for x in lines] == ["hello"]
    assert lines[0]["key"] == "k1" and lines[0]["properties"] == {"a": "b"}
    assert main(["--root", root, "topics", "stats", "orders"]) == 0
    assert json.loads(capsys.readouterr().out)["msgInCounter"] == 1
    assert (
        main(["--root", root, "policies", "set", "public/default", "retention_time_minutes=60"])
        == 0
    )
    assert main(["--root", root, "policies", "set", "public/default", "retention_days=1"]) == 2
    assert "unknown policy retention_days" in capsys.readouterr().err
    assert main(["--root", root, "--output", "json", "retention", "--sweep-orphans"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["retention"]["managed_ledgers"] == 2 and report["orphans"]["deleted"] == []
    code, out, _ = _run(["--root", root, "retention", "--sweep-orphans"], capsys)
    assert code == 0 and out.startswith("retention: 2 managed ledgers") and "orphans:" in out
    assert main(["--root", root, "--output", "json", "retention", "orders", "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)  # a dry run changes nothing, reports both
    assert list(dry) == ["retention", "orphans"] and dry["retention"]["deleted_files"] == 0
    assert main(["--root", root, "retention", "nope"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["--root", root, "topics", "delete-partitioned-topic", "orders"]) == 0
    assert main(["--root", root, "topics", "stats", "orders"]) == 1


def test_cli_reports_bad_arguments_as_errors(tmp_path: Any, capsys: Any) -> None:
    """Malformed arguments give one ``error:`` line naming the argument, exit code 2, and
    change nothing."""
    root = str(tmp_path)
    assert main(["--root", root, "topics", "create", "t"]) == 0
    assert main(["--root", root, "topics", "create-subscription", "t", "-s", "s"]) == 0
    capsys.readouterr()
    cases = [
        (
            ["policies", "set", "public/default", "retention_time_minutes=abc"],
            "retention_time_minutes: value 'abc' is not JSON",
        ),
        (["policies", "set", "public/default", "retention_time_minutes"], "must be name=value"),
        (["produce", "t", "--property", "foo", "-m", "x"], "--property must be name=value"),
        (["produce", "t"], "produce needs messages"),
        (["produce", "t", "-f", "/no/such/file"], "-f /no/such/file: no such file"),
        (["produce", "t", "-m", "x", "-n", "0"], "-n/--num-produce must be >= 1"),
        (["retention", "--orphan-min-age-hours", "-5"], "--orphan-min-age-hours must be"),
        (["retention", "--sweep-orphans", "--orphan-min-age-hours", "nan"], ">= 0, got nan"),
        (["peek", "t", "--start", "zz"], "--start: message id 'zz' is malformed"),
        (
            ["namespaces", "set-retention", "public/default", "--time", "3x", "--size", "1G"],
            "'3x' is not a duration",
        ),
        (
            ["namespaces", "set-retention", "public/default", "--time", "3d", "--size", "10GB"],
            "'10GB' is not a size",
        ),
        (["namespaces", "set-retention", "public/default", "--time", "3d"], "needs --time"),
        (["namespaces", "set-message-ttl", "public/default", "--ttl", "soon"], "not a duration"),
        (["namespaces", "set-deduplication", "public/default"], "exactly one of --enable"),
        (["namespaces", "create", "no-slash"], "must be tenant/namespace"),
        (["topics", "create", "bad name!"], "topic name 'bad name!' is not allowed"),
        (["topics", "create-partitioned-topic", "p", "-p", "0"], "needs -p/--partitions"),
        (["topics", "create-partitioned-topic", "p", "-p", "x"], "must be an integer"),
        (["topics", "reset-cursor", "t", "-s", "s"], "one of -m/--messageId and -t/--time"),
        (["topics", "reset-cursor", "t", "-s", "s", "-t", "yesterday"], "not a duration"),
        (["topics", "reset-cursor", "t", "-s", "s", "-m", "zz"], "message id 'zz' is malformed"),
        (["topics", "skip", "t", "-s", "s"], "skip needs -n/--count"),
        (["topics", "skip", "t", "-n", "1"], "needs -s/--subscription"),
        (["topics", "expire-messages", "t", "-s", "s", "-t", "1x"], "not a duration"),
        (["consume", "t", "-s", "c", "-t", "Sharde"], "use one of Exclusive, Shared"),
        (["consume", "t", "-s", "c", "-p", "Middle"], "use one of Latest, Earliest"),
        (["topics", "frobnicate", "t"], "invalid choice: 'frobnicate'"),
    ]
    for args, message in cases:
        code, out, err = _run(["--root", root, *args], capsys)
        assert code == 2, (args, code, err)
        assert err.startswith("error: ") and err.count("\n") == 1, (args, err)
        assert message in err and out == "", (args, err)
    for options in ["{bad", "[1]"]:
        assert main(["--root", root, "--storage-options", options, "topics", "list"]) == 2
        assert "--storage-options must be a JSON object" in capsys.readouterr().err
    # Nothing was produced and no policy was set.
    assert Admin(root).topics().get_stats("t")["msgInCounter"] == 0
    assert Admin(root).namespaces().get_retention("public/default") == {
        "retentionTimeInMinutes": 0,
        "retentionSizeInMB": 0,
    }
    assert Admin(root).topics().list() == ["persistent://public/default/t"]


def test_cli_errors_on_missing_things_exit_1(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    assert main(["--root", root, "topics", "create", "t"]) == 0
    capsys.readouterr()
    cases = [
        (
            ["topics", "stats", "nope"],
            "error: topic persistent://public/default/nope does not exist",
        ),
        (["topics", "delete", "nope"], "does not exist"),
        (["topics", "peek-messages", "t", "-s", "nope"], "subscription 'nope' does not exist"),
        (["topics", "skip", "t", "-s", "nope", "-n", "1"], "subscription 'nope' does not exist"),
        (["topics", "clear-backlog", "t", "-s", "nope"], "does not exist"),
        (["topics", "unsubscribe", "t", "-s", "nope"], "does not exist"),
        (["topics", "create", "t"], "already exists"),
        (["namespaces", "delete", "acme/none"], "namespace acme/none does not exist"),
        (["tenants", "delete", "acme"], "tenant acme does not exist"),
    ]
    for args, message in cases:
        code, out, err = _run(["--root", root, *args], capsys)
        assert code == 1 and err.startswith("error: ") and err.count("\n") == 1, (args, err)
        assert message in err and out == "", (args, err)
    with pytest.raises(TopicNotFound):
        Admin(root).topics().get_stats("nope")


def test_cli_admin_commands(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)

    def ok(*args: str) -> str:
        code, out, err = _run(["--url", root, *args], capsys)
        assert code == 0 and err == "", (args, err)
        return out

    assert ok("tenants", "create", "acme") == "created tenant acme\n"
    assert ok("namespaces", "create", "acme/shop") == "created namespace acme/shop\n"
    assert ok("tenants", "list") == "acme\npublic\npulsar\n"  # with Pulsar's built-in two
    assert ok("namespaces", "list", "acme") == "acme/shop\n"
    ns = "acme/shop"
    ok("namespaces", "set-retention", ns, "--time", "3d", "--size", "10G")
    assert json.loads(ok("namespaces", "get-retention", ns)) == {
        "retentionTimeInMinutes": 4320,
        "retentionSizeInMB": 10240,
    }
    ok("namespaces", "set-message-ttl", ns, "-ttl", "2h")
    ok("namespaces", "set-deduplication", ns, "--enable")
    ok("namespaces", "set-delayed-delivery", ns, "--disable", "--time", "2s")
    ok("namespaces", "set-subscription-expiration-time", ns, "-t", "90")
    ok("namespaces", "set-max-message-size", ns, "-m", "1M")
    ok("namespaces", "set-auto-topic-creation", ns, "-e", "--type", "partitioned", "-n", "2")
    pol = json.loads(ok("namespaces", "policies", ns))  # pulsar-admin's JSON
    assert pol["message_ttl_in_seconds"] == 7200 and pol["deduplicationEnabled"] is True
    assert pol["delayed_delivery_policies"]["active"] is False
    assert pol["delayed_delivery_policies"]["tickTime"] == 2000
    assert pol["subscription_expiration_time_minutes"] == 90
    assert pol["filepulsar"]["max_message_size"] == 1 << 20
    assert pol["autoTopicCreationOverride"]["defaultNumPartitions"] == 2
    effective = json.loads(ok("policies", "get", ns))  # ours: every policy, our names
    assert effective["message_ttl_seconds"] == 7200 and effective["max_message_size"] == 1 << 20
    ok("namespaces", "remove-retention", ns)
    ok("namespaces", "remove-message-ttl", ns)
    assert json.loads(ok("namespaces", "get-retention", ns))["retentionTimeInMinutes"] == 0

    t = "persistent://acme/shop/orders"
    ok("topics", "create-partitioned-topic", t, "-p", "2")
    ok("topics", "update-partitioned-topic", t, "-p", "3")
    ok("topics", "create", "persistent://acme/shop/single")
    listed = json.loads(ok("topics", "list", ns, "--output", "json"))
    assert {"topic": t, "partitions": 3} in listed and len(listed) == 2
    ok("produce", t, "-m", "a", "-m", "b", "-n", "5", "-k", "k", "-p", "x=1,y=2")
    assert json.loads(ok("topics", "stats", t))["msgInCounter"] == 10
    assert (
        len(json.loads(ok("topics", "partitioned-stats", t, "--per-partition"))["partitions"]) == 3
    )
    internal = json.loads(ok("topics", "stats-internal", f"{t}-partition-0"))
    assert "ledgers" in internal and "cursors" in internal
    ok("topics", "create-subscription", t, "-s", "sub", "-m", "earliest")
    assert ok("topics", "subscriptions", t) == "sub\n"
    peeked = [
        json.loads(x)
        for x in ok(
            "topics", "peek-messages", t, "-s", "sub", "-n", "3", "--output", "json"
        ).splitlines()
    ]
    assert (
        len(peeked) == 3
        and peeked[0]["key"] == "k"
        and peeked[0]["properties"] == {"x": "1", "y": "2"}
    )
    one = ok("produce", "persistent://acme/shop/single", "-m", "only", "--output", "json")
    assert json.loads(one)["produced"] == 1
    ex = json.loads(
        ok(
            "topics",
            "examine-message",
            "persistent://acme/shop/single",
            "-i",
            "earliest",
            "--output",
            "json",
        )
    )
    assert ex["value"] == "only"

    def backlog() -> int:
        return int(json.loads(ok("topics", "stats", t))["subscriptions"]["sub"]["msgBacklog"])

    assert backlog() == 10
    ok("topics", "clear-backlog", t, "-s", "sub")
    assert backlog() == 0
    ok("topics", "reset-cursor", t, "-s", "sub", "-t", "1h")
    assert backlog() == 10
    ok("topics", "expire-messages", t, "-s", "sub", "-t", "0")
    assert backlog() == 0
    ok("topics", "reset-cursor", t, "-s", "sub", "-m", "earliest")
    # every message was its own batch of 5 per key... the producer batches: count entries
    # (pulsar-admin skips on one partition: the one the key "k" was routed to)
    parts = json.loads(ok("topics", "partitioned-stats", t, "--per-partition"))["partitions"]
    keyed = next(p for p, st in parts.items() if st["subscriptions"]["sub"]["msgBacklog"])
    skipped = json.loads(ok("topics", "skip", keyed, "-s", "sub", "-n", "1", "--output", "json"))
    assert skipped["skippedEntries"] >= 1 and backlog() < 10
    ok("topics", "unsubscribe", t, "-s", "sub")
    assert ok("topics", "subscriptions", t) == ""
    ok("topics", "delete-partitioned-topic", t)
    ok("namespaces", "delete", ns, "--force")
    assert ok("namespaces", "list", "acme") == ""
    ok("tenants", "delete", "acme")


def test_cli_produce_file_and_consume(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path / "root")
    src = tmp_path / "lines.txt"
    src.write_bytes(b"".join(b"line-%d\n" % i for i in range(5000)) + b"crlf\r\n\r\nlast")
    code, out, _ = _run(["--url", root, "produce", "t", "-f", str(src), "--output", "json"], capsys)
    assert code == 0 and json.loads(out)["produced"] == 5003
    code, out, _ = _run(
        ["--url", root, "consume", "t", "-s", "c", "-p", "Earliest", "-n", "5003"], capsys
    )
    lines = out.split("\n")
    assert (
        code == 0 and lines[:2] == ["line-0", "line-1"] and lines[5000:5003] == ["crlf", "", "last"]
    )
    code, out, _ = _run(["--url", root, "topics", "stats", "t"], capsys)
    assert json.loads(out)["subscriptions"]["c"]["msgBacklog"] == 0  # all acknowledged
    _run(["--url", root, "produce", "t", "-m", "x", "-k", "kk"], capsys)
    code, out, _ = _run(["--url", root, "consume", "t", "-s", "c", "--output", "json"], capsys)
    msg = json.loads(out)
    assert code == 0 and msg["value"] == "x" and msg["key"] == "kk" and msg["redeliveryCount"] == 0


@pytest.mark.procs
def test_cli_root_from_env_and_config_file(tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    env = _env(root)
    r = subprocess.run(
        [*_script(), "topics", "create", "t"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    # stdin, and the root from ./client.conf
    (tmp_path / "client.conf").write_text(f"# as pulsar's client.conf\nurl={root}\n")
    r = subprocess.run(
        [*_script(), "produce", "t", "-f", "-"],
        env=_env(),
        input="a\nb\nc\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert r.returncode == 0 and "produced 3 messages" in r.stdout, r.stderr
    r = subprocess.run(
        [*_script(), "topics", "stats", "t"],
        env=_env(),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert json.loads(r.stdout)["msgInCounter"] == 3
    # no root anywhere: one line naming the three ways
    r = subprocess.run(
        [*_script(), "topics", "list"],
        env=_env(HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        cwd=tmp_path / "root",
        check=False,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--url" in r.stderr and "FILEPULSAR_URL" in r.stderr and "client.conf" in r.stderr


@pytest.mark.skipif(shutil.which("head") is None, reason="needs head")
@pytest.mark.procs
def test_cli_closed_pipe_is_quiet(tmp_path: Any) -> None:
    """``filepulsar ... | head -1``: the reader exits early; no traceback, exit code 141."""
    root = str(tmp_path / "root")
    src = tmp_path / "lines.txt"
    # ~570 KB of output, several times a pipe's buffer: the consumer is still writing when
    # head has gone.
    src.write_bytes(b"".join(b"message number %d\n" % i for i in range(30_000)))
    env = _env(root)
    r = subprocess.run(
        [*_script(), "produce", "t", "-f", str(src)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    cmd = " ".join(_script()) + " consume t -s c -p Earliest -n 30000 | head -1"
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd + "; echo status=${PIPESTATUS[0]} >&2"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.stdout == "message number 0\n"
    assert "Traceback" not in r.stderr and "status=141" in r.stderr, r.stderr
    # What did not reach the pipe is not acknowledged.
    stats = Admin(root).topics().get_stats("t")
    assert stats["subscriptions"]["c"]["msgBacklog"] > 0
    cmd = " ".join(_script()) + " topics peek-messages t -s c -n 100000 | head -1"
    r = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, check=False)
    assert "Traceback" not in r.stderr and r.stdout.count("\n") == 1


@pytest.mark.procs
def test_cli_consume_stops_cleanly_on_ctrl_c(tmp_path: Any) -> None:
    """``consume -n 0`` runs until Ctrl-C: SIGINT ends it with exit code 130, no traceback,
    the consumer closed (its lease released) and what was printed acknowledged."""
    root = str(tmp_path / "root")
    with Client(root) as c:
        p = c.create_producer("t", batching_enabled=False)
        for i in range(3):
            p.send(b"m%d" % i)
        p.close()
    proc = subprocess.Popen(
        [*_script(), "consume", "t", "-s", "c", "-p", "Earliest", "-n", "0"],
        env=_env(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        got = [proc.stdout.readline() for _ in range(3)]  # it is consuming now
        assert got == [b"m0\n", b"m1\n", b"m2\n"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    stats = Admin(root).topics().get_stats("t")
    assert stats["subscriptions"]["c"]["msgBacklog"] == 0
    assert stats["subscriptions"]["c"]["consumers"] == []  # closed, not left to expire
    with Client(root) as c:  # an Exclusive consumer can attach at once
        c.subscribe("t", "c", initial_position=InitialPosition.Earliest).close()


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """Run the console script with stderr on a real pty; (exit code, stdout, what the
    terminal showed)."""
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([*_script(), *argv], env=env, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        chunks: list[bytes] = []

        def drain() -> None:  # the terminal must be read while the bar is drawn, or it blocks
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the pty is closed once the process is gone
                    return
                if not chunk:
                    return
                chunks.append(chunk)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        out, _ = proc.communicate(timeout=120)
        reader.join(timeout=30)
    finally:
        os.close(master)
    return proc.returncode, out, b"".join(chunks)


@pytest.mark.procs
def test_cli_progress_on_a_terminal_only(tmp_path: Any) -> None:
    """``produce -f`` draws a progress bar when stderr is a terminal (a real pty here) and
    writes nothing to stderr when it is piped."""

    src = tmp_path / "lines.txt"
    src.write_bytes(b"x\n" * 30_000)  # a few seconds of producing, each run
    env = _env(str(tmp_path / "root"))
    code, out, seen = _on_a_terminal(["produce", "t", "-f", str(src)], env)
    assert code == 0 and b"produced 30000 messages" in out
    assert b"produce lines.txt" in seen and b"%" in seen, seen[:300]
    r = subprocess.run(
        [*_script(), "produce", "t", "-f", str(src)], env=env, capture_output=True, check=False
    )
    assert r.returncode == 0 and r.stderr == b""


def test_produce_file_is_batched_as_pulsar_clients_produce(tmp_path: Any, capsys: Any) -> None:
    """``produce -f`` batches (pulsar-client's produce does unless ``-db``): 20,000 lines go
    into entries of up to 1000 messages, not one entry per line; ``-db`` sends one each."""
    root = str(tmp_path / "root")
    src = tmp_path / "events.txt"
    src.write_bytes(b"".join(b"event-%d\n" % i for i in range(20_000)))
    code, out, _ = _run(["--url", root, "produce", "batched", "-f", str(src)], capsys)
    assert code == 0 and out == "produced 20000 messages to persistent://public/default/batched\n"
    stats = Admin(root).topics().get_internal_stats("batched")
    assert stats["ledgers"][0]["messages"] == 20_000
    assert stats["numberOfEntries"] <= 40  # 1000 messages (or 128 KB) an entry
    code, _, _ = _run(["--url", root, "produce", "single", "-f", str(src), "-db"], capsys)
    assert code == 0
    assert Admin(root).topics().get_internal_stats("single")["numberOfEntries"] == 20_000
    with Client(root) as c:  # every line arrives, in order
        r = c.create_reader("batched", start_message_id=pulsar_earliest())
        got = [r.read_next(5000).data() for _ in range(20_000)]
        r.close()
    assert got[0] == b"event-0" and got[-1] == b"event-19999" and len(set(got)) == 20_000


def pulsar_earliest() -> Any:
    from filepulsar import MessageId

    return MessageId.earliest


@pytest.mark.procs
def test_produce_progress_bar_moves_while_a_file_is_sent(tmp_path: Any) -> None:
    """On a terminal the bar is drawn as each block of the file is sent: a 4 MB file shows
    the percentages in between, not 0 % until it is done."""
    import re

    src = tmp_path / "big.txt"
    src.write_bytes(b"0123456789abcdef0123456789abcde\n" * (4 << 15))  # 4 MB, 131,072 lines
    code, out, seen = _on_a_terminal(["produce", "t", "-f", str(src)], _env(str(tmp_path / "root")))
    assert code == 0 and b"produced 131072 messages" in out
    shown = {int(x) for x in re.findall(rb"(\d+)%", seen)}
    assert {25, 50, 75} <= shown, sorted(shown)
