"""Parsing Spark's string options into typed values, once, with errors that name what is allowed.

Spark hands a data source a case-insensitive mapping; ``dict(options)`` would lowercase every
key (PYSPARK_NOTES gotcha 2). :class:`OptionReader` matches names case-insensitively against
the option names we declare, converts each value, and at the end reports every option nobody
asked for, so a typo fails at ``load()``/``start()`` instead of being ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from filepulsar.dispatch.modes import Mode, allowed_spellings, parse_mode
from filepulsar.storage import jsontext
from filepulsar.storage.errors import InvalidConfiguration

M = TypeVar("M", bound=Mode)

#: Options Spark itself passes to every data source; never reported as unknown.
SPARK_OPTIONS = frozenset({"path", "paths", "checkpointlocation", "queryname"})


class OptionReader:
    """Typed access to a data source's options.

    Parameters
    ----------
    options
        The options Spark passed (any mapping; keys compared case-insensitively).
    what
        How errors name the consumer, e.g. ``"filepulsar source"``.
    """

    def __init__(self, options: Mapping[str, Any], what: str) -> None:
        self.what = what
        self._values: dict[str, tuple[str, str]] = {}
        for k, v in dict(options).items():
            self._values[str(k).lower()] = (str(k), "" if v is None else str(v))
        self._seen: set[str] = set()
        self._canonical: dict[str, str] = {}  # lowercase → the documented spelling

    def _get(self, name: str) -> str | None:
        self._seen.add(name.lower())
        self._canonical[name.lower()] = name
        hit = self._values.get(name.lower())
        return None if hit is None else hit[1]

    def has(self, name: str) -> bool:
        self._seen.add(name.lower())
        self._canonical[name.lower()] = name
        return name.lower() in self._values

    def string(self, name: str, default: str | None = None) -> str | None:
        v = self._get(name)
        if v is None or v == "":
            return default
        return v

    def required(self, name: str, hint: str = "") -> str:
        v = self.string(name)
        if v is None:
            raise InvalidConfiguration(
                f"{self.what}: option '{name}' is required{': ' + hint if hint else ''}"
            )
        return v

    def integer(
        self, name: str, default: int | None = None, *, minimum: int | None = None
    ) -> int | None:
        v = self._get(name)
        if v is None or v == "":
            return default
        try:
            n = int(v)
        except ValueError as e:
            raise InvalidConfiguration(
                f"{self.what}: option '{name}' must be an integer, got {v!r}"
            ) from e
        if minimum is not None and n < minimum:
            raise InvalidConfiguration(
                f"{self.what}: option '{name}' must be >= {minimum}, got {n}"
            )
        return n

    def boolean(self, name: str, default: bool) -> bool:
        v = self._get(name)
        if v is None or v == "":
            return default
        low = v.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise InvalidConfiguration(f"{self.what}: option '{name}' must be true or false, got {v!r}")

    def choice(self, name: str, allowed: Iterable[str], default: str) -> str:
        """One of ``allowed`` (matched case-insensitively; the canonical spelling returned)."""
        allowed = list(allowed)
        v = self._get(name)
        if v is None or v == "":
            return default
        for a in allowed:
            if a.lower() == v.strip().lower():
                return a
        raise InvalidConfiguration(
            f"{self.what}: option '{name}' is {v!r}; allowed: {', '.join(allowed)}"
        )

    def mode(self, name: str, cls: type[M], default: M) -> M:
        """A member of the closed set ``cls`` (:mod:`filepulsar.dispatch.modes`): either spelling
        (``Key_Shared`` or ``KeyShared``), ignoring case, ``_`` and ``-``."""
        v = self._get(name)
        if v is None or v.strip() == "":
            return default
        try:
            return parse_mode(cls, v)
        except InvalidConfiguration as e:
            raise InvalidConfiguration(
                f"{self.what}: option '{name}' is {v!r}; allowed: "
                f"{', '.join(allowed_spellings(cls))}"
            ) from e

    def json_value(self, name: str) -> Any:
        v = self._get(name)
        if v is None or v == "":
            return None
        try:
            return jsontext.loads(v)
        except ValueError as e:
            raise InvalidConfiguration(
                f"{self.what}: option '{name}' must be JSON, got {_short(v)} ({e})"
            ) from e

    def check_unknown(self, known: Iterable[str] = ()) -> None:
        """Raise if an option was given that no accessor asked for (or in ``known``).

        Raises
        ------
        InvalidConfiguration
            Naming the unknown options and listing every option this consumer accepts.
        """
        accepted = self._seen | {k.lower() for k in known} | SPARK_OPTIONS
        unknown = sorted(orig for low, (orig, _) in self._values.items() if low not in accepted)
        if unknown:
            names = sorted(
                {self._canonical.get(k, k) for k in self._seen} | set(known), key=str.lower
            )
            raise InvalidConfiguration(
                f"{self.what}: unknown option(s) {', '.join(unknown)}; accepted (case-"
                f"insensitive): {', '.join(names)}"
            )


def _short(value: str, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters so an error stays one short line."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[: limit - 20]}... ({len(value)} characters)"


def storage_root(opts: OptionReader) -> str:
    """The storage root from ``path`` (``load(path)``/``save(path)``) or ``serviceUrl``.

    Raises
    ------
    InvalidConfiguration
        If neither or both (with different values) are given.
    """
    path = opts.string("path")
    url = opts.string("serviceUrl")
    if path and url and path != url:
        raise InvalidConfiguration(
            f"{opts.what}: both path {path!r} and serviceUrl {url!r} were given; use one"
        )
    root = path or url
    if not root:
        raise InvalidConfiguration(
            f"{opts.what}: no storage root; pass it to load()/save() or set option 'serviceUrl' "
            "(a local path, file://, s3://bucket/prefix or memory://name)"
        )
    return root


def storage_options(opts: OptionReader) -> dict[str, Any]:
    """fsspec storage options from ``storageOptions`` (a JSON object), e.g. an S3 endpoint."""
    v = opts.json_value("storageOptions")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InvalidConfiguration(f"{opts.what}: option 'storageOptions' must be a JSON object")
    return v
