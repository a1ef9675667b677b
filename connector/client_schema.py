"""Schemas of message values: pulsar-client's ``pulsar.schema`` (records, fields, schemas).

A :class:`Record` subclass declares typed fields; :class:`JsonSchema` and :class:`AvroSchema`
turn its instances into bytes and back, :class:`StringSchema` and :class:`BytesSchema` do the
same for ``str`` and ``bytes``. Give a schema to ``Client.create_producer``, ``subscribe`` or
``create_reader``: the producer registers it in the topic's schema registry
(``storage.schemas``, checked for compatibility per the namespace's strategy) and stamps its
version on every message; a consumer's or reader's schema is checked against the topic's, or
registered on an idle topic with none (as Pulsar's broker does); ``Message.value()`` decodes
with the consumer's schema, reading Avro data through the writer's schema version so evolved
schemas resolve. :class:`AutoConsumeSchema` and :class:`AutoProduceBytesSchema` are Pulsar's
``AUTO_CONSUME`` and ``AUTO_PRODUCE_BYTES`` (not in pulsar-client's Python library).

Decoding builds records with a function compiled once per record class
(:func:`_compile_builder`), so a message costs about what decoding its data costs.

The declared shape is Pulsar's: ``Record.schema()`` is the Avro record schema pulsar-client
derives (a field not ``required`` is a union with ``"null"``; ``required_default=True`` writes
the field's default into the schema; ``_sorted_fields`` sorts fields by name; ``_avro_namespace``
sets the namespace). Differences from pulsar-client, on purpose: a keyword argument naming no
field raises ``TypeError`` (pulsar-client ignores it), and JSON is written compactly.
"""

from __future__ import annotations

import base64
import enum
import io
import json
from collections.abc import Callable
from typing import Any, ClassVar

from filepulsar.storage.errors import IncompatibleSchema, InvalidConfiguration

__all__ = [
    "Array",
    "AutoConsumeSchema",
    "AutoProduceBytesSchema",
    "AvroSchema",
    "Boolean",
    "Bytes",
    "BytesSchema",
    "CustomEnum",
    "Double",
    "Field",
    "Float",
    "Integer",
    "JsonSchema",
    "Long",
    "Map",
    "Null",
    "ProtobufNativeSchema",
    "Record",
    "Schema",
    "SchemaInfo",
    "SchemaType",
    "String",
    "StringSchema",
]


def _type_name(t: Any) -> str:
    if isinstance(t, tuple):
        return " or ".join(_type_name(x) for x in t)
    return getattr(t, "__name__", str(t))


# ----------------------------------------------------------------------------- fields
class Field:
    """A typed field of a :class:`Record`.

    ``default`` is the value an instance gets when the field is not given (checked against the
    type); ``required`` makes the Avro type non-nullable; ``required_default`` writes the
    default into the schema (so readers of older data can fill the field in).
    """

    #: The Avro type name.
    avro: ClassVar[str] = ""
    #: Python types a value may have.
    accepts: ClassVar[tuple[type, ...]] = ()
    #: The default when none is declared.
    implicit_default: ClassVar[Any] = None
    #: Types whose values are stored as given (a fast path of :meth:`validate_type`).
    exact: ClassVar[frozenset[type]] = frozenset()
    #: Whether values need converting to and from Avro/JSON data (enums, containers).
    converts: ClassVar[bool] = False

    def __init__(
        self, default: Any = None, required: bool = False, required_default: bool = False
    ) -> None:
        self._required = required
        self._required_default = required_default
        self._default = None if default is None else self.validate_type("default", default)

    def type(self) -> str:
        return self.avro

    def python_type(self) -> Any:
        return self.accepts

    def default(self) -> Any:
        return self.implicit_default if self._default is None else self._default

    def required_default(self) -> bool:
        return self._required_default

    def validate_type(self, name: str, val: Any) -> Any:
        """``val`` as stored in the field (``None`` becomes the default unless required).

        Raises
        ------
        TypeError
            Naming the field and the type it accepts.
        """
        if type(val) in self.exact:
            return val
        if val is None and not self._required:
            return self.default()
        if isinstance(val, bool) and bool not in self.accepts:
            raise TypeError(
                f"Invalid type '{type(val)}' for field '{name}'. Expected: "
                f"{_type_name(self.accepts)}"
            )
        if not isinstance(val, self.accepts):
            raise TypeError(
                f"Invalid type '{type(val)}' for field '{name}'. Expected: "
                f"{_type_name(self.accepts)}"
            )
        return val

    def schema(self) -> Any:
        return self.schema_info(set())

    def schema_info(self, defined_names: set[str]) -> Any:
        return self.avro

    # Avro/JSON value conversion (overridden by the container and enum fields).
    def to_avro(self, val: Any) -> Any:
        return val

    def to_json(self, val: Any) -> Any:
        return val

    def from_data(self, val: Any) -> Any:
        return val


class Null(Field):
    avro = "null"
    accepts = (type(None),)

    def validate_type(self, name: str, val: Any) -> Any:
        if val is not None:
            raise TypeError(f"Field {name} is set to be None")
        return val


class Boolean(Field):
    avro = "boolean"
    accepts = (bool,)
    exact = frozenset({bool})
    implicit_default = False


class Integer(Field):
    avro = "int"
    accepts = (int,)
    exact = frozenset({int})


class Long(Field):
    avro = "long"
    accepts = (int,)
    exact = frozenset({int})


class Float(Field):
    avro = "float"
    accepts = (float, int)
    exact = frozenset({float, int})


class Double(Field):
    avro = "double"
    accepts = (float, int)
    exact = frozenset({float, int})


class Bytes(Field):
    avro = "bytes"
    accepts = (bytes, str)
    exact = frozenset({bytes})
    converts = True  # JSON holds bytes as text

    def validate_type(self, name: str, val: Any) -> Any:
        val = super().validate_type(name, val)
        return val.encode() if isinstance(val, str) else val

    def to_json(self, val: Any) -> Any:
        return val.decode() if isinstance(val, bytes) else val


class String(Field):
    avro = "string"
    accepts = (str, bytes)
    exact = frozenset({str})

    def validate_type(self, name: str, val: Any) -> Any:
        val = super().validate_type(name, val)
        return val.decode() if isinstance(val, bytes) else val


class CustomEnum(Field):
    """A field holding members of a Python :class:`enum.Enum` (an Avro enum of their names).
    A value may be given as the member, its name or its value."""

    avro = "enum"
    converts = True

    def __init__(
        self,
        enum_type: type[enum.Enum],
        default: Any = None,
        required: bool = False,
        required_default: bool = False,
    ) -> None:
        if not (isinstance(enum_type, type) and issubclass(enum_type, enum.Enum)):
            raise TypeError(f"{_type_name(enum_type)} is not a valid Enum type")
        self.enum_type = enum_type
        #: Members by name and by int value (what decoded Avro and JSON data hold).
        self.lookup: dict[Any, enum.Enum] = {m.name: m for m in enum_type}
        self.lookup.update({m.value: m for m in enum_type if type(m.value) is int})
        super().__init__(default, required, required_default)

    def python_type(self) -> Any:
        return self.enum_type

    def validate_type(self, name: str, val: Any) -> Any:
        if val is None:
            return None
        if isinstance(val, self.enum_type):
            return val
        if isinstance(val, str) and not isinstance(val, enum.Enum):
            if val in self.enum_type.__members__:
                return self.enum_type.__members__[val]
            raise TypeError(
                f"Invalid enum value '{val}' for field '{name}'. Expected: "
                f"{list(self.enum_type.__members__)}"
            )
        if isinstance(val, int) and not isinstance(val, bool | enum.Enum):
            for m in self.enum_type:
                if m.value == val:
                    return m
            raise TypeError(
                f"Invalid enum value '{val}' for field '{name}'. Expected: "
                f"{[m.value for m in self.enum_type]}"
            )
        raise TypeError(
            f"Invalid type '{type(val)}' for field '{name}'. Expected: {_type_name(self.enum_type)}"
        )

    def schema_info(self, defined_names: set[str]) -> Any:
        name = self.enum_type.__name__
        if name in defined_names:
            return name
        defined_names.add(name)
        return {"type": "enum", "name": name, "symbols": [m.name for m in self.enum_type]}

    def to_avro(self, val: Any) -> Any:
        return val.name if isinstance(val, enum.Enum) else val

    def to_json(self, val: Any) -> Any:
        return val.value if isinstance(val, enum.Enum) else val


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


# ----------------------------------------------------------------------------- schemas
class SchemaType(enum.Enum):
    """Pulsar's schema type names (the ones filepulsar writes)."""

    BYTES = "BYTES"
    STRING = "STRING"
    JSON = "JSON"
    AVRO = "AVRO"
    PROTOBUF_NATIVE = "PROTOBUF_NATIVE"
    #: :class:`AutoConsumeSchema` (never registered).
    AUTO_CONSUME = "AUTO_CONSUME"
    #: :class:`AutoProduceBytesSchema` (registers the topic's own schema, or none).
    AUTO_PUBLISH = "AUTO_PUBLISH"


class SchemaInfo:
    """What a schema registers in a topic: its type, name and definition text."""

    def __init__(self, schema_type: SchemaType, name: str, definition: str) -> None:
        self._type = schema_type
        self._name = name
        self._definition = definition

    def schema_type(self) -> SchemaType:
        return self._type

    def name(self) -> str:
        return self._name

    def schema(self) -> str:
        return self._definition

    def __repr__(self) -> str:
        return f"SchemaInfo({self._type.name}, {self._name!r})"


class Schema:
    """Base of the schemas: ``encode(value) -> bytes`` and ``decode(bytes) -> value``."""

    def __init__(
        self, record_cls: Any, schema_type: SchemaType, definition: Any, name: str
    ) -> None:
        self._record_cls = record_cls
        text = "" if definition is None else json.dumps(definition, sort_keys=True)
        self._schema_info = SchemaInfo(schema_type, name, text)
        #: Decodes data of another (writer) schema version; set by a consumer (Avro).
        self._writer_lookup: Callable[[str, int], Any] | None = None
        #: The topic's stored schema version (a ``StoredSchema``); set by a consumer.
        self._stored_lookup: Callable[[str, int], Any] | None = None

    def schema_info(self) -> SchemaInfo:
        return self._schema_info

    def encode(self, obj: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError

    def decode_message(self, data: bytes, topic: str, version: int) -> Any:
        """Decode a received message's value written with schema ``version`` of ``topic``."""
        return self.decode(data)

    def _validate_object_type(self, obj: Any) -> None:
        if not isinstance(obj, self._record_cls):
            raise TypeError(
                f"Invalid record obj of type {type(obj)} - expected type is "
                f"{_type_name(self._record_cls)}"
            )


class BytesSchema(Schema):
    """Values are ``bytes`` as they are (the default)."""

    def __init__(self) -> None:
        super().__init__(bytes, SchemaType.BYTES, None, "BYTES")

    def encode(self, data: Any) -> bytes:
        self._validate_object_type(data)
        return bytes(data)

    def decode(self, data: bytes) -> Any:
        return data

    def __str__(self) -> str:
        return "BytesSchema"


class StringSchema(Schema):
    """Values are ``str``, stored as UTF-8."""

    def __init__(self) -> None:
        super().__init__(str, SchemaType.STRING, None, "STRING")

    def encode(self, obj: Any) -> bytes:
        self._validate_object_type(obj)
        return str(obj).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise IncompatibleSchema(f"value is not UTF-8 text: {e}") from e

    def __str__(self) -> str:
        return "StringSchema"


def _check_record_cls(record_cls: Any, what: str) -> None:
    if not (isinstance(record_cls, type) and issubclass(record_cls, Record)):
        raise InvalidConfiguration(f"{what} needs a Record subclass, got {record_cls!r}")


class JsonSchema(Schema):
    """Values are instances of a :class:`Record` class, stored as JSON objects (enums by value,
    bytes as text). The registered definition is the class's Avro record schema."""

    def __init__(self, record_cls: type[Record]) -> None:
        _check_record_cls(record_cls, "JsonSchema")
        super().__init__(record_cls, SchemaType.JSON, record_cls.schema(), "JSON")
        self._build = record_cls._builder()
        self._dump = record_cls._dumper(avro=False)
        self._dumps = json.JSONEncoder(separators=(",", ":")).encode

    def encode(self, obj: Any) -> bytes:
        self._validate_object_type(obj)
        if type(obj) is not self._record_cls:
            self._validate_object_type(obj)
        return self._dumps(self._dump(obj)).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        try:
            d = json.loads(data)
        except ValueError as e:
            raise IncompatibleSchema(f"value is not JSON: {e}") from e
        if not isinstance(d, dict):
            raise IncompatibleSchema(f"JSON value is a {type(d).__name__}, not an object")
        try:
            return self._build(d)
        except TypeError as e:  # a field of another type than the record declares
            raise IncompatibleSchema(f"JSON value does not match the record: {e}") from e

    def __str__(self) -> str:
        return f"JsonSchema({self._record_cls.__name__})"


def _without_fastavro_keys(definition: Any) -> Any:
    """``definition`` without the ``__fastavro_parsed`` / ``__named_schemas`` ... keys."""
    if isinstance(definition, dict):
        return {
            k: _without_fastavro_keys(v)
            for k, v in definition.items()
            if not (isinstance(k, str) and k.startswith("__"))
        }
    if isinstance(definition, list):
        return [_without_fastavro_keys(x) for x in definition]
    return definition


class AvroSchema(Schema):
    """Values stored in Avro's binary encoding (fastavro).

    Give a :class:`Record` class (values are its instances), or ``None`` and an Avro
    ``schema_definition`` dict (values are dicts). A consumer decodes a message with the
    schema version it was written with, resolved to this schema (Avro schema evolution).
    """

    def __init__(self, record_cls: Any, schema_definition: dict[str, Any] | None = None) -> None:
        import fastavro

        if record_cls is None and schema_definition is None:
            raise InvalidConfiguration(
                "AvroSchema needs a Record class or a schema_definition, got neither"
            )
        if record_cls is not None:
            _check_record_cls(record_cls, "AvroSchema")
            definition = record_cls.schema()
        else:
            # A schema fastavro has parsed (``fastavro.schema.load_schema``) carries its own
            # bookkeeping keys; the registry keeps the plain Avro schema.
            definition = _without_fastavro_keys(schema_definition)
        self._fastavro = fastavro
        self._definition = definition
        try:
            self._parsed = fastavro.parse_schema(json.loads(json.dumps(definition)))
        except Exception as e:  # fastavro raises several exception types for bad schemas
            raise InvalidConfiguration(f"not a valid Avro schema: {e}") from e
        self._writers: dict[tuple[str, int], Any] = {}
        from fastavro.read import SchemaResolutionError

        self._reader = fastavro.schemaless_reader
        self._resolution_error = SchemaResolutionError
        self._build = None if record_cls is None else record_cls._builder(typed=True)
        self._dump = None if record_cls is None else record_cls._dumper(avro=True)
        self._writer = fastavro.schemaless_writer
        super().__init__(record_cls, SchemaType.AVRO, definition, "AVRO")

    def encode(self, obj: Any) -> bytes:
        if self._record_cls is not None:
            dump = self._dump
            if type(obj) is self._record_cls and dump is not None:
                data = dump(obj)
            else:
                self._validate_object_type(obj)
                data = obj._data(avro=True)
        elif isinstance(obj, dict):
            data = obj
        else:
            raise TypeError(
                f"AvroSchema without a record class encodes dicts, got {type(obj).__name__}"
            )
        buf = io.BytesIO()
        try:
            self._writer(buf, self._parsed, data)
        except (ValueError, TypeError, KeyError) as e:
            raise TypeError(f"value does not match its Avro schema: {e}") from e
        return buf.getvalue()

    def _decode_with(self, data: bytes, writer: Any, reader: Any) -> Any:
        """Decode ``data`` written with ``writer``, resolved to ``reader`` (None: the
        writer's schema is ours, nothing to resolve)."""
        try:
            d = self._reader(io.BytesIO(data), writer, reader)
        except self._resolution_error as e:
            raise IncompatibleSchema(f"the writer's schema does not resolve to ours: {e}") from e
        except (EOFError, IndexError, ValueError, TypeError, KeyError, OverflowError) as e:
            # What fastavro raises for bytes that are not this schema's encoding.
            raise IncompatibleSchema(
                f"value is not Avro data of its schema: {type(e).__name__}: {e}"
            ) from e
        build = self._build
        return d if build is None else build(d)

    def decode(self, data: bytes) -> Any:
        return self._decode_with(data, self._parsed, None)

    def decode_message(self, data: bytes, topic: str, version: int) -> Any:
        if version < 0 or self._writer_lookup is None:
            return self._decode_with(data, self._parsed, None)
        key = (topic, version)
        writer = self._writers.get(key)
        if writer is None:
            definition = self._writer_lookup(topic, version)
            if not isinstance(definition, dict):
                writer = self._parsed  # another type's version: try our own schema
            else:
                d = dict(definition)
                # As pulsar-client does: the writer's top-level record is read as ours, so
                # a renamed record class still resolves field by field.
                if isinstance(self._definition, dict) and "name" in self._definition:
                    d["name"] = self._definition["name"]
                    if "namespace" in self._definition:
                        d["namespace"] = self._definition["namespace"]
                    else:
                        d.pop("namespace", None)
                # The writer's schema is ours (the usual case): read without resolving,
                # which fastavro would otherwise find out by comparing the two schemas,
                # field by field, on every message.
                same = d == self._definition
                writer = self._parsed if same else self._fastavro.parse_schema(d)
            self._writers[key] = writer
        return self._decode_with(data, writer, None if writer is self._parsed else self._parsed)

    def __str__(self) -> str:
        name = self._record_cls.__name__ if self._record_cls is not None else "dict"
        return f"AvroSchema({name})"


class ProtobufNativeSchema(Schema):
    """Values are instances of a protobuf message class, in protobuf's own binary encoding.

    The registered definition is Pulsar's ``ProtobufNativeSchemaData`` (what the Java client
    writes): ``fileDescriptorSet`` (base64 of a ``FileDescriptorSet`` holding the message's
    file and every file it depends on, dependencies first), ``rootMessageTypeName`` and
    ``rootFileDescriptorName``.

    Raises
    ------
    TypeError
        If ``record_cls`` is not a protobuf message class.
    """

    def __init__(self, record_cls: Any) -> None:
        from google.protobuf import descriptor_pb2
        from google.protobuf.message import Message as ProtobufMessage

        if not (isinstance(record_cls, type) and issubclass(record_cls, ProtobufMessage)):
            raise TypeError(f"record_cls must be a protobuf Message subclass, got {record_cls!r}")
        descriptor: Any = getattr(record_cls, "DESCRIPTOR")  # noqa: B009 (protobuf's, untyped)
        files = descriptor_pb2.FileDescriptorSet()
        seen: set[str] = set()

        def add(fd: Any) -> None:
            if fd.name in seen:
                return
            for dep in fd.dependencies:
                add(dep)
            seen.add(fd.name)
            proto = descriptor_pb2.FileDescriptorProto()
            fd.CopyToProto(proto)
            files.file.append(proto)

        add(descriptor.file)
        definition = {
            "fileDescriptorSet": base64.b64encode(files.SerializeToString()).decode("ascii"),
            "rootMessageTypeName": descriptor.full_name,
            "rootFileDescriptorName": descriptor.file.name,
        }
        super().__init__(record_cls, SchemaType.PROTOBUF_NATIVE, definition, "PROTOBUF_NATIVE")

    def encode(self, obj: Any) -> bytes:
        self._validate_object_type(obj)
        return bytes(obj.SerializeToString())

    def decode(self, data: bytes) -> Any:
        return self._record_cls.FromString(data)

    def __str__(self) -> str:
        return f"ProtobufNativeSchema({self._record_cls.__name__})"


# ----------------------------------------------------------------------------- AUTO schemas
def _protobuf_class(definition: dict[str, Any]) -> Any:
    """The message class a ``PROTOBUF_NATIVE`` definition describes (a dynamic class built
    from its file descriptor set, as Java's generic protobuf-native schema does)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(
        base64.b64decode(definition["fileDescriptorSet"])
    )
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(definition["rootMessageTypeName"])
    )


def _generic_decoder(stored: Any) -> Callable[[bytes], Any]:
    """A decoder of values written with the stored schema version ``stored`` into generic
    values: ``dict`` for ``AVRO`` and ``JSON`` records, ``str`` for ``STRING``, ``bytes`` for
    ``BYTES``, a (dynamic) protobuf message for ``PROTOBUF_NATIVE``. Its errors are
    :class:`IncompatibleSchema`."""
    t = stored.type
    if stored.deleted:
        raise IncompatibleSchema(
            f"schema version {stored.version} is a deletion marker, not a schema"
        )
    if t == "BYTES":
        return bytes
    if t == "STRING":
        return StringSchema().decode
    if t == "JSON":

        def decode_json(data: bytes) -> Any:
            try:
                return json.loads(data)
            except ValueError as e:
                raise IncompatibleSchema(f"value is not JSON: {e}") from e

        return decode_json
    if t == "AVRO":
        import fastavro

        parsed = fastavro.parse_schema(stored.parsed())
        reader = fastavro.schemaless_reader

        def decode_avro(data: bytes) -> Any:
            buf = io.BytesIO(data)
            try:
                out = reader(buf, parsed, None)
            except (EOFError, IndexError, ValueError, TypeError, KeyError, OverflowError) as e:
                raise IncompatibleSchema(
                    f"value is not Avro data of its schema: {type(e).__name__}: {e}"
                ) from e
            if buf.tell() != len(data):
                raise IncompatibleSchema(
                    f"value is not Avro data of its schema: {len(data) - buf.tell()} bytes "
                    "left over after the record"
                )
            return out

        return decode_avro
    if t == "PROTOBUF_NATIVE":
        from google.protobuf.message import DecodeError

        cls = _protobuf_class(stored.parsed())

        def decode_protobuf(data: bytes) -> Any:
            try:
                return cls.FromString(data)
            except DecodeError as e:
                raise IncompatibleSchema(f"value is not a {cls.DESCRIPTOR.full_name}: {e}") from e

        return decode_protobuf
    raise IncompatibleSchema(f"schema version {stored.version} has unknown type {t!r}")


class AutoConsumeSchema(Schema):
    """Pulsar's ``AUTO_CONSUME`` (Java's ``Schema.AUTO_CONSUME()``): read a topic of any
    schema, decoding each message with the schema version that wrote it.

    Give it to ``subscribe`` or ``create_reader``. It is neither registered nor checked
    against the topic's schema. ``Message.value()`` returns a generic value: a ``dict`` for
    ``AVRO`` and ``JSON`` records (Avro enums as their symbol, JSON as written), ``str`` for
    ``STRING``, ``bytes`` for ``BYTES`` and for messages written without a schema, and a
    protobuf message of a class built from the stored descriptor for ``PROTOBUF_NATIVE``.
    ``Message.int_schema_version()`` says which version wrote it. pulsar-client (Python) has
    no such schema; the dicts are what its ``AvroSchema(None, schema_definition)`` returns.
    """

    def __init__(self) -> None:
        super().__init__(None, SchemaType.AUTO_CONSUME, None, "AUTO_CONSUME")
        self._decoders: dict[tuple[str, int], Callable[[bytes], Any]] = {}

    def encode(self, obj: Any) -> bytes:
        raise TypeError("AutoConsumeSchema only decodes: give it to subscribe or create_reader")

    def decode(self, data: bytes) -> Any:
        """``data`` as it is (a value with no writer version is bytes)."""
        return data

    def decode_message(self, data: bytes, topic: str, version: int) -> Any:
        if version < 0 or self._stored_lookup is None:
            return data
        key = (topic, version)
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = self._decoders[key] = _generic_decoder(self._stored_lookup(topic, version))
        return decoder(data)

    def __str__(self) -> str:
        return "AutoConsumeSchema"


class AutoProduceBytesSchema(Schema):
    """Pulsar's ``AUTO_PRODUCE_BYTES`` (Java's ``Schema.AUTO_PRODUCE_BYTES()``): send values
    already encoded as bytes to a topic with a schema, checked against that schema first.

    Give it to ``create_producer``: the producer takes the topic's latest schema version and
    stamps it on every message; ``send(b)`` decodes ``b`` with that schema and refuses bytes
    that do not decode (:class:`IncompatibleSchema`, nothing stored). Avro data must be one
    whole record of the schema; JSON must be an object whose fields have the record's types
    (enums by symbol or value, bytes as text) with every non-nullable field without a default
    present; ``STRING`` must be UTF-8; protobuf must parse as the root message. On a topic
    with no schema the bytes are sent as they are, unstamped. With ``schema`` given (Java's
    ``AUTO_PRODUCE_BYTES(schema)``), that schema is registered as a producer's would be and
    the bytes are checked by decoding with it. pulsar-client (Python) has no such schema.
    """

    def __init__(self, schema: Schema | None = None) -> None:
        if schema is not None and (
            not isinstance(schema, Schema)
            or isinstance(schema, AutoConsumeSchema | AutoProduceBytesSchema)
        ):
            raise InvalidConfiguration(
                "AutoProduceBytesSchema takes None or the schema to check the bytes with "
                f"(StringSchema(), JsonSchema(RecordClass), AvroSchema(...)), got {schema!r}"
            )
        super().__init__(bytes, SchemaType.AUTO_PUBLISH, None, "AUTO_PRODUCE_BYTES")
        self._given = schema
        self._check: Callable[[bytes], Any] | None = None
        self._against = ""

    def _bound(self, check: Callable[[bytes], Any] | None, against: str) -> AutoProduceBytesSchema:
        """A copy checking the bytes with ``check`` (one per producer: the topic's schema)."""
        out = AutoProduceBytesSchema(self._given)
        out._check = check
        out._against = against
        return out

    def encode(self, data: Any) -> bytes:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(
                f"AutoProduceBytesSchema sends bytes already encoded, got {type(data).__name__}"
            )
        raw = bytes(data)
        check = self._check
        if check is not None:
            try:
                check(raw)
            except IncompatibleSchema as e:
                raise IncompatibleSchema(
                    f"bytes refused by AutoProduceBytesSchema: they are not a value of "
                    f"{self._against}: {e}"
                ) from e
        return raw

    def decode(self, data: bytes) -> Any:
        return data

    def __str__(self) -> str:
        return "AutoProduceBytesSchema" + (f"({self._given})" if self._given else "")


_JSON_KINDS: dict[str, tuple[type, ...]] = {
    "null": (type(None),),
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (int, float),
    "double": (int, float),
    "string": (str,),
    "bytes": (str,),
}


def _json_problem(value: Any, t: Any, names: dict[str, Any], path: str) -> str:
    """Why a decoded JSON value does not fit Avro type ``t`` as filepulsar's and Pulsar's JSON
    schemas write it ("" if it does)."""
    where = path or "the value"
    if isinstance(t, list):
        if any(not _json_problem(value, b, names, path) for b in t):
            return ""
        return f"{where} is {json.dumps(value)[:40]}, which fits no branch of {t}"
    if isinstance(t, str):
        if t in _JSON_KINDS:
            ok = isinstance(value, _JSON_KINDS[t]) and not (
                isinstance(value, bool) and t != "boolean"
            )
            return "" if ok else f"{where} is {json.dumps(value)[:40]}, not {t}"
        named = names.get(t) or names.get(t.rsplit(".", 1)[-1])
        if named is None:
            return f"{where}: unknown Avro type {t!r}"
        t = named
    kind = t.get("type")
    if isinstance(kind, dict | list) or kind in _JSON_KINDS:
        return _json_problem(value, kind, names, path)
    if kind in ("record", "error"):
        names.setdefault(t.get("name", ""), t)
        if not isinstance(value, dict):
            return f"{where} is {json.dumps(value)[:40]}, not a {t.get('name')} object"
        for f in t.get("fields", []):
            sub = f"{path}.{f['name']}" if path else f["name"]
            if f["name"] in value:
                problem = _json_problem(value[f["name"]], f["type"], names, sub)
                if problem:
                    return problem
            elif "default" not in f and _json_problem(None, f["type"], names, sub):
                return f"field {sub} is missing (it is not nullable and has no default)"
        return ""
    if kind == "enum":
        names.setdefault(t.get("name", ""), t)
        ok = isinstance(value, str | int) and not isinstance(value, bool)
        return "" if ok else f"{where} is {json.dumps(value)[:40]}, not a {t.get('name')} symbol"
    if kind == "fixed":
        names.setdefault(t.get("name", ""), t)
        return "" if isinstance(value, str) else f"{where} is not text (fixed {t.get('name')})"
    if kind == "array":
        if not isinstance(value, list):
            return f"{where} is {json.dumps(value)[:40]}, not an array"
        for i, x in enumerate(value):
            problem = _json_problem(x, t["items"], names, f"{path}[{i}]")
            if problem:
                return problem
        return ""
    if kind == "map":
        if not isinstance(value, dict):
            return f"{where} is {json.dumps(value)[:40]}, not an object (map)"
        for k, x in value.items():
            problem = _json_problem(x, t["values"], names, f"{path}[{k!r}]")
            if problem:
                return problem
        return ""
    return f"{where}: unknown Avro type {kind!r}"


def _bytes_check(stored: Any) -> Callable[[bytes], Any] | None:
    """How :class:`AutoProduceBytesSchema` checks bytes against stored version ``stored``
    (None: anything goes, a ``BYTES`` schema)."""
    if stored.type == "BYTES":
        return None
    decode = _generic_decoder(stored)
    if stored.type != "JSON":
        return decode
    definition = stored.parsed()

    def check_json(data: bytes) -> None:
        problem = _json_problem(decode(data), definition, {}, "")
        if problem:
            raise IncompatibleSchema(problem)

    return check_json


# ----------------------------------------------------------------------------- binding
def check_schema_arg(schema: Any, *, producer: bool) -> Schema | None:
    """``schema`` as a client call takes it: None or a :class:`Schema`.

    A producer's :class:`BytesSchema` is kept: it registers the ``BYTES`` type, so the topic
    then refuses producers of other types, as pulsar-client's own tests expect. A consumer's
    or reader's :class:`BytesSchema` is None: it reads any topic's values as bytes.

    Raises
    ------
    InvalidConfiguration
        (a ``ValueError``) If it is something else.
    """
    if schema is None:
        return None
    if not isinstance(schema, Schema):
        raise InvalidConfiguration(
            "schema must be a filepulsar.schema schema (BytesSchema(), StringSchema(), "
            f"JsonSchema(RecordClass), AvroSchema(RecordClass)), got {schema!r}"
        )
    if isinstance(schema, BytesSchema) and not producer:
        return None
    if isinstance(schema, AutoConsumeSchema) and producer:
        raise InvalidConfiguration(
            "AutoConsumeSchema is for subscribe and create_reader; a producer of encoded bytes "
            "takes AutoProduceBytesSchema()"
        )
    if isinstance(schema, AutoProduceBytesSchema) and not producer:
        raise InvalidConfiguration(
            "AutoProduceBytesSchema is for create_producer; a consumer or reader of any "
            "schema takes AutoConsumeSchema()"
        )
    return schema


def register_for_producer(
    store: Any, topic: Any, schema: Schema | None, policies: Any
) -> tuple[bytes, Schema | None]:
    """Register a producer's schema in ``topic``'s registry: the version bytes to stamp and
    the schema the producer encodes with (for :class:`AutoProduceBytesSchema`, a copy bound
    to the topic's latest schema version, or to its own ``schema`` registered as a producer's).

    A producer without a schema writes unstamped bytes; that is refused on a topic with a
    schema only when the ``schema_validation_enforced`` policy is on (as in Pulsar).

    Raises
    ------
    IncompatibleSchema
        Per ``storage.schemas``.
    """
    from filepulsar.storage.schemas import SchemaRegistry, version_bytes

    registry = SchemaRegistry(store, topic)
    if isinstance(schema, AutoProduceBytesSchema) and schema._given is None:
        latest = registry.latest()
        if latest is None:
            return b"", schema._bound(None, "")
        against = f"topic {topic.base}'s schema version {latest.version} ({latest.type})"
        return version_bytes(latest.version), schema._bound(_bytes_check(latest), against)
    if schema is None:
        if policies.schema_validation_enforced and registry.latest() is not None:
            raise IncompatibleSchema(
                f"topic {topic.base} has a schema and schema_validation_enforced is on: a "
                "producer without a schema may not write to it"
            )
        return b"", None
    own = schema._given if isinstance(schema, AutoProduceBytesSchema) else schema
    assert own is not None
    info = own.schema_info()
    stored = registry.register(
        info.schema_type().value,
        info.schema(),
        info.name(),
        strategy=policies.schema_compatibility_strategy,
        allow_auto_update=policies.is_allow_auto_update_schema,
    )
    if isinstance(schema, AutoProduceBytesSchema):
        against = f"{own} (topic {topic.base}'s schema version {stored.version})"
        return version_bytes(stored.version), schema._bound(_bytes_check(stored), against)
    return version_bytes(stored.version), schema


def _topic_in_use(store: Any, topic: Any) -> str:
    """Why ``topic`` is in use, as Pulsar's broker decides before letting a consumer register
    a schema ("" if it is idle): it holds data, or a producer or consumer is connected."""
    import time

    from filepulsar.storage.errors import SubscriptionNotFound
    from filepulsar.storage.manifest import ManifestStore
    from filepulsar.storage.subscriptions import SubscriptionStore, list_subscriptions
    from filepulsar.storage.topics import managed_ledgers

    now = int(time.time() * 1000)
    for t in managed_ledgers(store, topic):
        ms = ManifestStore(store, t)
        if not ms.exists():
            continue
        state = ms.latest()
        if any(lg.entries for lg in state.ledgers):
            return f"{t} holds messages"
        if any(lease.expires_ms > now for lease in state.producers.values()):
            return f"{t} has a connected producer"
        for sub in list_subscriptions(store, t):
            try:
                live = SubscriptionStore(store, t, sub).latest().live_consumers(now)
            except SubscriptionNotFound:
                continue
            if live:
                return f"subscription {sub!r} of {t} has a connected consumer"
    return ""


def bind_for_reading(
    store: Any, topic: Any, schema: Schema | None, policies: Any, *, role: str = "consumer"
) -> None:
    """Check a consumer's or reader's schema against ``topic``'s and let it look up writer
    versions (for Avro resolution and :class:`AutoConsumeSchema`).

    As Pulsar's broker: on a topic with no schema, the schema is registered if the topic is
    idle (no data, no connected producer or consumer) and the namespace allows auto-update;
    a topic in use without a schema refuses a consumer with one (there is nothing to check
    it against) unless the strategy is ``ALWAYS_COMPATIBLE``. :class:`AutoConsumeSchema`
    neither registers nor is checked.

    Raises
    ------
    IncompatibleSchema
        If the schema cannot read the topic's (per the compatibility strategy), or cannot be
        registered (auto-update off, or the topic in use without a schema).
    """
    if schema is None:
        return
    from filepulsar.storage.names import TopicName
    from filepulsar.storage.schemas import SchemaRegistry

    registry = SchemaRegistry(store, topic)
    if not isinstance(schema, AutoConsumeSchema):
        info = schema.schema_info()
        type_, definition = info.schema_type().value, info.schema()
        strategy = policies.schema_compatibility_strategy
        if registry.latest() is None:
            busy = _topic_in_use(store, topic)
            if not busy:
                registry.register(
                    type_,
                    definition,
                    info.name(),
                    strategy=strategy,
                    allow_auto_update=policies.is_allow_auto_update_schema,
                    role=role,
                )
            elif strategy != "ALWAYS_COMPATIBLE":
                raise IncompatibleSchema(
                    f"{role} schema {type_} cannot be checked against topic {topic.base}: the "
                    f"topic has no schema and is in use ({busy}), so no schema is registered "
                    f"for it (strategy {strategy}; as Pulsar: read it without a schema, with "
                    "AutoConsumeSchema, or register one with Admin.schemas().create_schema)"
                )
        else:
            registry.check_reader(type_, definition, strategy=strategy, role=role)
    registries: dict[str, SchemaRegistry] = {str(registry.topic): registry}

    def stored_version(topic_name: str, version: int) -> Any:
        t = TopicName.parse(topic_name).base
        reg = registries.get(str(t))
        if reg is None:
            reg = registries[str(t)] = SchemaRegistry(store, t)
        return reg.get(version)

    def lookup(topic_name: str, version: int) -> Any:
        stored = stored_version(topic_name, version)
        return stored.parsed() if stored.type in ("AVRO", "JSON") else None

    if schema._writer_lookup is None:
        schema._writer_lookup = lookup
    if schema._stored_lookup is None:
        schema._stored_lookup = stored_version
