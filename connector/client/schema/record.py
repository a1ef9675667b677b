"""A client schema's :class:`Record` (typed fields declared on a class, its Avro record schema,
its instances to and from Avro/JSON data), the container fields that may hold records
(:class:`Array`, :class:`Map`), and the record builders compiled once per record class."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar

from filepulsar.connector.client.schema.fields import (
    Boolean,
    CustomEnum,
    Field,
    _type_name,
)


def _as_field(x: Any, what: str) -> Field | Record:
    if isinstance(x, Field | Record):
        return x
    if isinstance(x, type) and issubclass(x, Record):
        return x()
    if isinstance(x, type) and issubclass(x, enum.Enum):
        return CustomEnum(x)
    raise TypeError(f"Argument {_type_name(x)} of {what} is not a Record or a Field")


def _item_schema(f: Field | Record, defined: set[str]) -> Any:
    return f.schema_info(defined) if isinstance(f, Array | Map | Record | CustomEnum) else f.type()


def _item_types(f: Field | Record) -> Any:
    return f.python_type()


class Array(Field):
    """A list of values of one field type (or one record class)."""

    avro = "array"
    converts = True
    accepts = (list,)

    def __init__(
        self,
        array_type: Any,
        default: Any = None,
        required: bool = False,
        required_default: bool = False,
    ) -> None:
        self.array_type = _as_field(array_type, "Array")
        super().__init__(default, required, required_default)

    def validate_type(self, name: str, val: Any) -> Any:
        if val is None:
            return None
        if not isinstance(val, list):
            raise TypeError(f"Invalid type '{type(val)}' for field '{name}'. Expected: list")
        item = self.array_type
        if isinstance(item, Record):
            out = [type(item)(**x) if isinstance(x, dict) else x for x in val]
        else:
            out = val
        for x in out:
            if not isinstance(x, _item_types(item)) or (
                isinstance(x, bool) and not isinstance(item, Boolean)
            ):
                raise TypeError(
                    f"Array field {name} items should all be of type {_type_name(item.type())}"
                )
        return out

    def schema_info(self, defined_names: set[str]) -> Any:
        return {"type": "array", "items": _item_schema(self.array_type, defined_names)}

    def to_avro(self, val: Any) -> Any:
        return None if val is None else [self.array_type.to_avro(x) for x in val]

    def to_json(self, val: Any) -> Any:
        return None if val is None else [self.array_type.to_json(x) for x in val]

    def from_data(self, val: Any) -> Any:
        return None if val is None else [self.array_type.from_data(x) for x in val]


class Map(Field):
    """A dict from strings to values of one field type (or one record class)."""

    avro = "map"
    converts = True
    accepts = (dict,)

    def __init__(
        self,
        value_type: Any,
        default: Any = None,
        required: bool = False,
        required_default: bool = False,
    ) -> None:
        self.value_type = _as_field(value_type, "Map")
        super().__init__(default, required, required_default)

    def validate_type(self, name: str, val: Any) -> Any:
        if val is None:
            return None
        if not isinstance(val, dict):
            raise TypeError(f"Invalid type '{type(val)}' for field '{name}'. Expected: dict")
        vt = self.value_type
        out = (
            {k: type(vt)(**v) if isinstance(v, dict) else v for k, v in val.items()}
            if isinstance(vt, Record)
            else val
        )
        for k, v in out.items():
            if not isinstance(k, str):
                raise TypeError(f"Map keys for field {name} should all be strings")
            if not isinstance(v, _item_types(vt)):
                raise TypeError(
                    f"Map values for field {name} should all be of type "
                    f"{_type_name(vt.python_type())}"
                )
        return out

    def schema_info(self, defined_names: set[str]) -> Any:
        return {"type": "map", "values": _item_schema(self.value_type, defined_names)}

    def to_avro(self, val: Any) -> Any:
        return None if val is None else {k: self.value_type.to_avro(v) for k, v in val.items()}

    def to_json(self, val: Any) -> Any:
        return None if val is None else {k: self.value_type.to_json(v) for k, v in val.items()}

    def from_data(self, val: Any) -> Any:
        return None if val is None else {k: self.value_type.from_data(v) for k, v in val.items()}


# ----------------------------------------------------------------------------- records
class _RecordMeta(type):
    """Collects a Record subclass's declared fields (in declaration order) into ``_fields``."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> Any:
        fields: dict[str, Field | Record] = {}
        for base in reversed(bases):
            fields.update(getattr(base, "_fields", {}))
        for key, value in ns.items():
            if key.startswith("_"):
                continue
            if isinstance(value, type) and issubclass(value, enum.Enum):
                fields[key] = CustomEnum(value)
            elif isinstance(value, _RecordMeta):
                fields[key] = value()
            elif isinstance(value, Field) or isinstance(type(value), _RecordMeta):
                fields[key] = value
        ns["_fields"] = fields
        return super().__new__(mcs, name, bases, ns)


_RESERVED = ("_default", "_required", "_required_default")


class Record(metaclass=_RecordMeta):
    """A structured value: subclass it and declare fields as class attributes.

    >>> class Order(Record):
    ...     id = Long(required=True)
    ...     item = String()
    >>> Order(id=1, item="book").item
    'book'

    A record class (or instance) may itself be a field of another record; ``default``,
    ``required`` and ``required_default`` then apply to it as to a field.
    """

    _fields: ClassVar[dict[str, Field | Record]] = {}
    _plan_cache: ClassVar[tuple[tuple[str, Any, bool], ...] | None] = None
    _builder_cache: ClassVar[Callable[[dict[str, Any]], Any] | None] = None
    _typed_builder_cache: ClassVar[Callable[[dict[str, Any]], Any] | None] = None
    _avro_dumper_cache: ClassVar[Callable[[Any], dict[str, Any]] | None] = None
    _json_dumper_cache: ClassVar[Callable[[Any], dict[str, Any]] | None] = None
    _avro_namespace: ClassVar[str | None] = None
    _sorted_fields: ClassVar[bool] = False
    # As a field of another record: its default and flags (set per instance by the
    # constructor; a decoded instance keeps these class-level values).
    _default: Any = None
    _required: bool = False
    _required_default: bool = False

    def __init__(
        self,
        default: Any = None,
        required_default: bool = False,
        required: bool = False,
        **kwargs: Any,
    ) -> None:
        d = self.__dict__
        d["_default"] = default
        d["_required_default"] = required_default
        d["_required"] = required
        fields = self._fields
        if kwargs and not kwargs.keys() <= fields.keys():
            unknown = sorted(set(kwargs) - set(fields))
            raise TypeError(
                f"{type(self).__name__} has no field {', '.join(unknown)}; its fields are "
                f"{', '.join(fields) or '(none)'}"
            )
        for k, f, sub in self._plan():
            if k in kwargs:
                v = kwargs[k]
                if sub and isinstance(v, dict) and isinstance(f, Record):
                    v = type(f)(**v)
                d[k] = f.validate_type(k, v)
            elif isinstance(f, Record):
                d[k] = f.default() if f._default is not None else f
            else:
                d[k] = f.default()

    @classmethod
    def _plan(cls) -> tuple[tuple[str, Any, bool], ...]:
        """The fields as (name, field, converts): whether values need converting to and from
        Avro/JSON data (sub-records, enums, containers). Computed once per class."""
        plan = cls.__dict__.get("_plan_cache")
        if plan is None:
            plan = tuple(
                (k, f, isinstance(f, Record) or f.converts) for k, f in cls._fields.items()
            )
            cls._plan_cache = plan
        return plan

    # -- the declared shape
    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The Avro record schema of this class (as pulsar-client derives it)."""
        out = cls.schema_info(set())
        assert isinstance(out, dict)
        return out

    @classmethod
    def schema_info(cls, defined_names: set[str]) -> Any:
        full = f"{cls._avro_namespace}.{cls.__name__}" if cls._avro_namespace else cls.__name__
        if full in defined_names:
            return full
        defined_names.add(full)
        out: dict[str, Any] = {"type": "record", "name": cls.__name__}
        if cls._avro_namespace is not None:
            out["namespace"] = cls._avro_namespace
        names = sorted(cls._fields) if cls._sorted_fields else list(cls._fields)
        fields = []
        for name in names:
            f = cls._fields[name]
            t = f.schema_info(defined_names)
            entry: dict[str, Any] = {"name": name, "type": t if f._required else ["null", t]}
            if f.required_default():
                d = f.default()
                entry["default"] = d.name if isinstance(d, enum.Enum) else d
            fields.append(entry)
        out["fields"] = fields
        return out

    # -- as a field of another record
    def type(self) -> str:
        return type(self).__name__

    def python_type(self) -> Any:
        return type(self)

    def default(self) -> Any:
        return self._default

    def required_default(self) -> bool:
        return bool(self._required_default)

    def validate_type(self, name: str, val: Any) -> Any:
        if val is None and not self._required:
            return self.default()
        if not isinstance(val, type(self)):
            raise TypeError(
                f"Invalid type '{type(val)}' for sub-record field '{name}'. Expected: "
                f"{type(self).__name__}"
            )
        return val

    def to_avro(self, val: Any) -> Any:
        return None if val is None else val._data(avro=True)

    def to_json(self, val: Any) -> Any:
        return None if val is None else val._data(avro=False)

    def from_data(self, val: Any) -> Any:
        return type(self)._from_data(val) if isinstance(val, dict) else val

    # -- values
    def __setattr__(self, key: str, value: Any) -> None:
        if key in _RESERVED:
            object.__setattr__(self, key, value)
            return
        f = self._fields.get(key)
        if f is None:
            raise AttributeError(f"Cannot set undeclared field {key} on record")
        object.__setattr__(self, key, f.validate_type(key, value))

    def _data(self, *, avro: bool) -> dict[str, Any]:
        """The values as Avro (``avro``) or JSON data: a dict of the fields."""
        return type(self)._dumper(avro=avro)(self)

    @classmethod
    def _dumper(cls, *, avro: bool) -> Callable[[Any], dict[str, Any]]:
        """The class's compiled ``_data`` (one dict display, conversions only where a field
        needs one), compiled once per class and form."""
        attr = "_avro_dumper_cache" if avro else "_json_dumper_cache"
        dump = cls.__dict__.get(attr)
        if dump is None:
            env: dict[str, Any] = {}
            items = []
            for i, (k, f, conv) in enumerate(cls._plan()):
                if isinstance(f, CustomEnum):
                    env[f"_c{i}"] = f.to_avro if avro else f.to_json
                    env[f"_t{i}"] = f.enum_type
                    attr_ = "name" if avro else "value"
                    items.append(f"{k!r}: v.{attr_} if type(v := d[{k!r}]) is _t{i} else _c{i}(v)")
                elif conv:
                    env[f"_c{i}"] = f.to_avro if avro else f.to_json
                    items.append(f"{k!r}: _c{i}(d[{k!r}])")
                else:
                    items.append(f"{k!r}: d[{k!r}]")
            # Our own text, built from the class's field names.
            exec(f"def dump(obj):\n    d = obj.__dict__\n    return {{{', '.join(items)}}}", env)
            dump = env["dump"]
            setattr(cls, attr, dump)
        return dump

    @classmethod
    def _builder(cls, *, typed: bool = False) -> Callable[[dict[str, Any]], Any]:
        """The class's compiled builder from decoded data (see :func:`_compile_builder`)."""
        attr = "_typed_builder_cache" if typed else "_builder_cache"
        build = cls.__dict__.get(attr)
        if build is None:
            build = _compile_builder(cls, typed=typed)
            setattr(cls, attr, build)
        return build

    @classmethod
    def _from_data(cls, data: dict[str, Any]) -> Any:
        """An instance from decoded Avro/JSON data (``data`` is changed and becomes the
        instance's): values are checked as the constructor checks them (JSON may come from
        anyone); keys naming no field are ignored."""
        return cls._builder()(data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return all(getattr(self, k, None) == getattr(other, k, None) for k in self._fields)

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields)
        return f"{type(self).__name__}({body})"

    __str__ = __repr__


_MISSING = object()


def _compile_builder(cls: type[Record], *, typed: bool) -> Callable[[dict[str, Any]], Any]:
    """A function building a ``cls`` instance from decoded data, as ``Record._from_data``
    specifies, compiled once per class (this keeps decoding a record close to the cost of
    decoding its data).

    The fast path takes data holding exactly the record's fields: the dict (the decoder's
    own, changed in place) becomes the instance's attributes, enums are looked up by symbol
    or value and containers and sub-records converted; a value must be of one of its
    field's exact types (a JSON value may be anything), unless ``typed``: data Avro decoded
    with the record's own schema, whose types are the fields' by construction, so only a
    null taking a field's default remains. Anything else takes the slow path: the plan
    unrolled, each value through its field's full check.
    """
    env: dict[str, Any] = {
        "_new": object.__new__,
        "_cls": cls,
        "_set": object.__setattr__,
        "_MISSING": _MISSING,
        "_keys": frozenset(cls._fields),
    }
    slow = ["def slow(data):", "    get = data.get"]
    fast = ["def build(d):"]
    if not typed:
        fast += ["    if d.keys() != _keys:", "        return slow(d)"]
    checks = []
    fixes = []
    items = []
    for i, (k, f, conv) in enumerate(cls._plan()):
        env[f"_f{i}"] = f
        if isinstance(f, Record):
            env[f"_m{i}"] = f.default() if f._default is not None else f
        else:
            env[f"_m{i}"] = f.default()
        slow += [f"    v = get({k!r}, _MISSING)", "    if v is _MISSING:", f"        v{i} = _m{i}"]
        if isinstance(f, CustomEnum):
            env[f"_l{i}"] = f.lookup
            env[f"_t{i}"] = f.enum_type
            lookup = [
                f"        m = _l{i}.get(v) if type(v) is str or type(v) is int else None",
                f"        v{i} = m if m is not None else _f{i}.validate_type({k!r}, v)",
            ]
            slow += [f"    elif type(v) is _t{i}:", f"        v{i} = v", "    else:", *lookup]
            fixes += [
                f"    v = d[{k!r}]",
                f"    if type(v) is not _t{i}:",
                *lookup,
                f"        d[{k!r}] = v{i}",
            ]
        elif conv:
            slow += ["    else:", f"        v{i} = _f{i}.validate_type({k!r}, _f{i}.from_data(v))"]
            fixes.append(f"    d[{k!r}] = _f{i}.validate_type({k!r}, _f{i}.from_data(d[{k!r}]))")
        else:
            env[f"_e{i}"] = f.exact
            slow += [
                f"    elif type(v) in _e{i}:",
                f"        v{i} = v",
                "    else:",
                f"        v{i} = _f{i}.validate_type({k!r}, v)",
            ]
            if not typed:
                checks.append(f"type(d[{k!r}]) in _e{i}")
            elif not f._required and f.default() is not None:
                fixes.append(f"    if d[{k!r}] is None:\n        d[{k!r}] = _m{i}")
        items.append(f"{k!r}: v{i}")
    slow += [
        "    obj = _new(_cls)",
        "    _set(obj, '__dict__', {'_default': None, '_required_default': False, "
        "'_required': False, " + ", ".join(items) + "})",
        "    return obj",
    ]
    if checks:
        fast += [f"    if not ({' and '.join(checks)}):", "        return slow(d)"]
    fast += [*fixes, "    obj = _new(_cls)", "    obj.__dict__.update(d)", "    return obj"]
    # Our own text, built from the class's field names.
    exec("\n".join(slow) + "\n\n\n" + "\n".join(fast), env)
    build: Callable[[dict[str, Any]], Any] = env["build"]
    return build
