"""``filepulsar schemas upload|get|delete``: pulsar-admin's ``schemas`` group
(:mod:`filepulsar.jobs.cli`).

``upload -f FILE`` reads pulsar-admin's schema file: ``{"type": "AVRO", "schema": "...",
"properties": {}}`` (``schema`` the definition text; an object is accepted too and written as
its JSON text).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from filepulsar.jobs.cli_support import EXIT_OK, BadArgument, open_admin, print_done, print_json


def _schema_file(path: str) -> tuple[str, str]:
    """(type, definition) from pulsar-admin's schema file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc: Any = json.load(f)
    except OSError as e:
        raise BadArgument(f"schemas upload: cannot read {path}: {e.strerror}") from e
    except ValueError as e:
        raise BadArgument(f"schemas upload: {path} is not JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("type"), str):
        raise BadArgument(
            f'schemas upload: {path} must be a JSON object {{"type": "AVRO", "schema": "...", '
            '"properties": {}}'
        )
    definition = doc.get("schema", "")
    if not isinstance(definition, str):
        definition = json.dumps(definition)
    return doc["type"].upper(), definition


def cmd_schemas(args: argparse.Namespace) -> int:
    schemas = open_admin(args).schemas()
    a, topic = args.action, args.topic
    if a == "upload":
        kind, definition = _schema_file(args.filename)
        version = schemas.create_schema(topic, kind, definition)
        print_done(args, f"uploaded a {kind} schema to {topic}: version {version}", version=version)
    elif a == "get":
        if args.all_version:
            print_json(schemas.get_all_versions(topic))
        else:
            print_json(schemas.get_schema(topic, args.version))
    else:
        n = schemas.delete_schema(topic)
        print_done(args, f"deleted the schema of {topic} ({n} versions)", versions=n)
    return EXIT_OK
