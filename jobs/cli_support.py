"""The ``filepulsar`` command's shared parts: exit codes, configuration and connection,
output (tables, JSON, progress) and argument helpers (:mod:`filepulsar.jobs.cli`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from filepulsar.connector.admin import Admin
from filepulsar.storage import (
    InvalidConfiguration,
    jsontext,
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141
ENV_URL = "FILEPULSAR_URL"
ENV_CONF = "FILEPULSAR_CONF"
#: Where the client configuration is looked for (the first that exists), as pulsar's
#: ``client.conf``: ``url=...`` and optionally ``storageOptions={...}``.
CONF_FILES = ("client.conf", "~/.config/filepulsar/client.conf")
#: Bytes read from a file per bulk send in ``produce -f``.
CHUNK_BYTES = 16 << 20


class BadArgument(InvalidConfiguration):
    """A command-line argument the CLI cannot use; the message names it and what is allowed.
    Reported as one ``error: ...`` line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """The command's argument parser: usage errors as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """One ``error:`` line and exit code 2 (argparse's own prints the usage first)."""
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------- configuration
def _conf_file() -> dict[str, str]:
    """``key=value`` lines of the first configuration file found ({} if none)."""
    env = os.environ.get(ENV_CONF)
    candidates = [env] if env else list(CONF_FILES)
    for name in candidates:
        path = Path(name).expanduser()
        if not path.is_file():
            if env:
                raise BadArgument(f"{ENV_CONF}={env}: no such file")
            continue
        out = {}
        for n, line in enumerate(path.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise BadArgument(f"{path}:{n}: expected key=value, got {line!r}")
            out[key.strip()] = value.strip()
        out["__file__"] = str(path)
        return out
    return {}


def _short(value: str, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters so an error stays one short line."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[: limit - 20]}... ({len(value)} characters)"


def _storage_options(text: str | None, where: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        opts = jsontext.loads(text)
    except ValueError as e:
        raise BadArgument(f"{where} must be a JSON object, got {_short(text)} ({e})") from e
    if not isinstance(opts, dict):
        raise BadArgument(f"{where} must be a JSON object, got {_short(text)}")
    return opts


def connection_of(args: argparse.Namespace) -> tuple[str, dict[str, Any] | None]:
    """The root URL and storage options: ``--url`` (or the old ``--root``), else
    ``$FILEPULSAR_URL``, else the configuration file."""
    conf: dict[str, str] | None = None
    url = next((u for u in (args.url, args.root) if u is not None), os.environ.get(ENV_URL))
    if url is None:
        conf = _conf_file()
        url = conf.get("url") or conf.get("webServiceUrl") or conf.get("brokerServiceUrl")
    if url is None:
        raise BadArgument(
            f"no storage root: give --url URL, set {ENV_URL}, or write url=... in "
            f"{' or '.join(CONF_FILES)}"
        )
    if args.storage_options:
        return url, _storage_options(args.storage_options, "--storage-options")
    conf = conf if conf is not None else _conf_file()
    where = f"storageOptions in {conf.get('__file__')}"
    return url, _storage_options(conf.get("storageOptions"), where)


def open_admin(args: argparse.Namespace) -> Admin:
    """An :class:`~filepulsar.connector.admin.Admin` on the storage root ``args`` name
    (:func:`connection_of`)."""
    url, opts = connection_of(args)
    return Admin(url, storage_options=opts)


# ---------------------------------------------------------------------------- output
def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout (bytes decoded, other objects as ``str``)."""
    print(json.dumps(value, indent=2, default=json_default))


def json_default(value: Any) -> Any:
    """``json.dumps``' ``default=`` for the CLI: bytes decoded (bad bytes replaced), anything
    else as ``str``."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def print_rows(
    args: argparse.Namespace, headers: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """A table: rich's on a terminal, tab-separated lines when piped, a JSON list of objects
    with ``--output json``."""
    if args.output == "json":
        print_json([dict(zip(headers, r, strict=True)) for r in rows])
        return
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(*headers)
        for r in rows:
            table.add_row(*(_cell(v) for v in r))
        Console().print(table)
        return
    for r in rows:
        print("\t".join(_cell(v) for v in r))


def _cell(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, dict | list):
        return json.dumps(v, default=json_default)
    return "" if v is None else str(v)


def print_list(args: argparse.Namespace, items: list[str]) -> None:
    """Names one per line (pulsar-admin's list output), a JSON list with ``--output json``."""
    if args.output == "json":
        print_json(items)
    else:
        for i in items:
            print(i)


def print_done(args: argparse.Namespace, text: str, **details: Any) -> None:
    """A one-line confirmation, or its details as JSON."""
    if args.output == "json":
        print_json(details or {"ok": True})
    else:
        print(text)


@contextmanager
def progress_bar(
    description: str, total: int | None, unit: str = ""
) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr while it is a terminal; silent otherwise. Yields
    ``update(done, total=None)``."""
    if not sys.stderr.isatty():
        yield lambda done, total=None: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
    columns.append(TextColumn("{task.percentage:>3.0f}%") if unit else MofNCompleteColumn())
    columns.append(TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def update(done: int, total: int | None = None) -> None:
            if total is not None:
                bar.update(task, total=total)
            bar.update(task, completed=done, refresh=True)  # drawn now, not at the next tick

        yield update


# ---------------------------------------------------------------------------- helpers
def parse_properties(items: list[str] | None) -> dict[str, str] | None:
    """``-p k=v`` arguments (each may hold several, comma separated, as pulsar-client's)."""
    if not items:
        return None
    props = {}
    for item in items:
        for part in item.split(","):
            name, sep, value = part.partition("=")
            if not sep or not name:
                raise BadArgument(f"--property must be name=value, got {part!r}")
            props[name] = value
    return props


def parse_policy_values(items: list[str]) -> dict[str, Any]:
    """``name=value`` policy arguments, each value JSON (a number, true/false, or a string in
    double quotes)."""
    values: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name or not raw:
            raise BadArgument(f"policy {item!r} must be name=value, value in JSON")
        try:
            values[name] = jsontext.loads(raw)
        except ValueError as e:
            raise BadArgument(
                f"policy {name}: value {_short(raw)} is not JSON; give a number, true/false, "
                "or a string in double quotes (e.g. auto_topic_creation_type='\"partitioned\"')"
            ) from e
    return values


def parse_orphan_min_age(hours: float) -> int:
    """``--orphan-min-age-hours`` in milliseconds; :class:`BadArgument` unless a finite number
    >= 0."""
    if not math.isfinite(hours) or hours < 0:
        raise BadArgument(
            f"--orphan-min-age-hours must be a number >= 0, got {hours!r} "
            "(keep it above your longest Spark batch; small values are unsafe)"
        )
    return int(hours * 3600 * 1000)


def non_negative(what: str) -> Callable[[str], int]:
    """An argparse ``type=`` for the option ``what``: an integer >= 0, else a one-line usage
    error naming the option."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None
        if n < 0:
            raise argparse.ArgumentTypeError(f"{what} must be >= 0, got {n}")
        return n

    return parse


def _message_json(m: dict[str, Any]) -> str:
    return json.dumps(
        {**m, "value": m["value"].decode(errors="replace") if m["value"] is not None else None},
        default=json_default,
    )


def print_messages(args: argparse.Namespace, msgs: list[dict[str, Any]]) -> None:
    """Messages as a table of id, key, properties and value, or one JSON object per line with
    ``--output json``."""
    if args.output == "json":
        for m in msgs:
            print(_message_json(m))
        return
    rows = [(m["messageId"], m["key"], m["properties"], m["value"]) for m in msgs]
    print_rows(args, ["messageId", "key", "properties", "value"], rows)
