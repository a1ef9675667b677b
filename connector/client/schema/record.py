"""A client schema's :class:`Record` (typed fields declared on a class, its Avro record schema,
its instances to and from Avro/JSON data), the container fields that may hold records
(:class:`Array`, :class:`Map`), and each record class's builder and dumper: closures made once
per class (no code is built from text)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar

from filepulsar.connector.client.schema.fields import (
    Boolean,
    CustomEnum,
    Field,
    type_name,
)


def _as_field(x: Any, what: str) -> Field | Record:
    if isinstance(x, Field | Record):
        return x
    if isinstance(x, type) and issubclass(x, Record):
        return x()
    if isinstance(x, type) and issubclass(x, enum.Enum):
        return CustomEnum(x)
    raise TypeError(f"Argument {type_name(x)} of {what} is not a Record or a Field")


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
                    f"Array field {name} items should all be of type {type_name(item.type())}"
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
                    f"{type_name(vt.python_type())}"
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
        """The class's ``_data`` as one function (see :func:`_make_dumper`), built once per
        class and form."""
        attr = "_avro_dumper_cache" if avro else "_json_dumper_cache"
        dump = cls.__dict__.get(attr)
        if dump is None:
            dump = _make_dumper(cls, avro=avro)
            setattr(cls, attr, dump)
        return dump

    @classmethod
    def _builder(cls, *, typed: bool = False) -> Callable[[dict[str, Any]], Any]:
        """The class's builder from decoded data (see :func:`_make_builder`)."""
        attr = "_typed_builder_cache" if typed else "_builder_cache"
        build = cls.__dict__.get(attr)
        if build is None:
            build = _make_builder(cls, typed=typed)
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


class _EnumOut(dict[Any, Any]):
    """An enum field's members to their Avro names or JSON values (``None`` to ``None``); a
    value that is no member comes out as it is, as :meth:`CustomEnum.to_avro` does."""

    def __missing__(self, key: Any) -> Any:
        return key


def _value_out(f: Field | Record, *, avro: bool) -> Callable[[Any], Any] | None:
    """How a field's value becomes Avro (``avro``) or JSON data: ``None`` when it is the data."""
    if isinstance(f, CustomEnum):
        out = _EnumOut({m: m.name if avro else m.value for m in f.enum_type})
        out[None] = None
        return out.__getitem__
    if isinstance(f, Record) or f.converts:
        return f.to_avro if avro else f.to_json
    return None


# One dict display per record size (1-4, 8, 16 fields: the same shape on purpose), each value
# taken as it is or through its field's conversion: within 5-15% of a display generated as
# text for the class (a loop over the fields, a comprehension or ``dict(zip(...))`` cost
# 1.4-2x per dump). Records of more than sixteen fields join one display per sixteen.
Out = Callable[[Any], Any] | None
Dump = Callable[[Any], dict[str, Any]]


def _take1(k0: str, c0: Out) -> Dump:
    def take(obj: Any) -> dict[str, Any]:
        d = obj.__dict__
        return {k0: d[k0] if c0 is None else c0(d[k0])}

    return take


def _take2(k0: str, c0: Out, k1: str, c1: Out) -> Dump:
    def take(obj: Any) -> dict[str, Any]:
        d = obj.__dict__
        return {
            k0: d[k0] if c0 is None else c0(d[k0]),
            k1: d[k1] if c1 is None else c1(d[k1]),
        }

    return take


def _take3(k0: str, c0: Out, k1: str, c1: Out, k2: str, c2: Out) -> Dump:
    def take(obj: Any) -> dict[str, Any]:
        d = obj.__dict__
        return {
            k0: d[k0] if c0 is None else c0(d[k0]),
            k1: d[k1] if c1 is None else c1(d[k1]),
            k2: d[k2] if c2 is None else c2(d[k2]),
        }

    return take


def _take4(k0: str, c0: Out, k1: str, c1: Out, k2: str, c2: Out, k3: str, c3: Out) -> Dump:
    def take(obj: Any) -> dict[str, Any]:
        d = obj.__dict__
        return {
            k0: d[k0] if c0 is None else c0(d[k0]),
            k1: d[k1] if c1 is None else c1(d[k1]),
            k2: d[k2] if c2 is None else c2(d[k2]),
            k3: d[k3] if c3 is None else c3(d[k3]),
        }

    return take


def _take8(
    k0: str, c0: Out, k1: str, c1: Out, k2: str, c2: Out, k3: str, c3: Out,
    k4: str, c4: Out, k5: str, c5: Out, k6: str, c6: Out, k7: str, c7: Out,
) -> Dump:  # fmt: skip
    def take(obj: Any) -> dict[str, Any]:
        d = obj.__dict__
        return {
            k0: d[k0] if c0 is None else c0(d[k0]),
            k1: d[k1] if c1 is None else c1(d[k1]),
            k2: d[k2] if c2 is None else c2(d[k2]),
            k3: d[k3] if c3 is None else c3(d[k3]),
            k4: d[k4] if c4 is None else c4(d[k4]),
            k5: d[k5] if c5 is None else c5(d[k5]),
            k6: d[k6] if c6 is None else c6(d[k6]),
            k7: d[k7] if c7 is None else c7(d[k7]),
        }

    return take


def _take16(
    k0: str,
    c0: Out,
    k1: str,
    c1: Out,
    k2: str,
    c2: Out,
    k3: str,
    c3: Out,
    k4: str,
    c4: Out,
    k5: str,
    c5: Out,
    k6: str,
    c6: Out,
    k7: str,
    c7: Out,
    k8: str,
    c8: Out,
    k9: str,
    c9: Out,
    k10: str,
    c10: Out,
    k11: str,
    c11: Out,
    k12: str,
    c12: Out,
    k13: str,
    c13: Out,
    k14: str,
    c14: Out,
    k15: str,
    c15: Out,
) -> Dump:
    def take(obj: Any) -> dict[str, Any]:
        d = obj.__dict__
        return {
            k0: d[k0] if c0 is None else c0(d[k0]),
            k1: d[k1] if c1 is None else c1(d[k1]),
            k2: d[k2] if c2 is None else c2(d[k2]),
            k3: d[k3] if c3 is None else c3(d[k3]),
            k4: d[k4] if c4 is None else c4(d[k4]),
            k5: d[k5] if c5 is None else c5(d[k5]),
            k6: d[k6] if c6 is None else c6(d[k6]),
            k7: d[k7] if c7 is None else c7(d[k7]),
            k8: d[k8] if c8 is None else c8(d[k8]),
            k9: d[k9] if c9 is None else c9(d[k9]),
            k10: d[k10] if c10 is None else c10(d[k10]),
            k11: d[k11] if c11 is None else c11(d[k11]),
            k12: d[k12] if c12 is None else c12(d[k12]),
            k13: d[k13] if c13 is None else c13(d[k13]),
            k14: d[k14] if c14 is None else c14(d[k14]),
            k15: d[k15] if c15 is None else c15(d[k15]),
        }

    return take


def _takes(pairs: list[tuple[str, Out]]) -> list[Dump]:
    """Displays covering ``pairs`` (name, conversion) in order, one per sixteen fields. A
    display a few fields short of the next size is filled by naming one of its plain fields
    again (a repeated key keeps its first place and its value is the same)."""
    out: list[Dump] = []
    plain: tuple[str, Out] | None = None
    while pairs:
        n = min(len(pairs), 16)
        chunk = pairs[:n]
        plain = next((p for p in chunk if p[1] is None), plain)
        size = next(s for s in _TAKES if s >= n)
        if size != n:
            if plain is None:
                n = max(s for s in _TAKES if s <= n)
                chunk = chunk[:n]
            else:
                chunk = chunk + [plain] * (size - n)
        out.append(_TAKES[len(chunk)](*(x for p in chunk for x in p)))
        pairs = pairs[n:]
    return out


_TAKES: dict[int, Callable[..., Dump]] = {
    1: _take1,
    2: _take2,
    3: _take3,
    4: _take4,
    8: _take8,
    16: _take16,
}


def _make_dumper(cls: type[Record], *, avro: bool) -> Callable[[Any], dict[str, Any]]:
    """A function from a ``cls`` instance to its values as Avro (``avro``) or JSON data: a
    dict of the fields in declaration order, each converted where its field needs it
    (sub-records, enums, containers, JSON's bytes). Built once per class and form."""
    takes = _takes([(k, _value_out(f, avro=avro)) for k, f, _ in cls._plan()])
    if not takes:
        return lambda obj: {}
    if len(takes) == 1:
        return takes[0]

    def dump(obj: Any) -> dict[str, Any]:
        out = {}
        for take in takes:
            out.update(take(obj))
        return out

    return dump


class _EnumIn(dict[Any, Any]):
    """An enum field's decoded values to its members: symbols (and int values unless
    ``typed``: JSON's form), ``None`` to ``None``; anything else through the field's full
    check (which raises for a value the enum lacks)."""

    def __init__(self, k: str, f: CustomEnum, *, typed: bool) -> None:
        super().__init__({m.name: m for m in f.enum_type} if typed else f.lookup)
        self[None] = None
        self.check = f.validate_type
        self.name = k

    def __missing__(self, key: Any) -> Any:
        return self.check(self.name, key)


#: The decoded types an enum field's fast path takes (others, as ``True`` equal to a value
#: of 1, go through the full check).
_ENUM_DATA = frozenset({str, int, type(None)})


def _value_in(k: str, f: Field | Record, *, typed: bool) -> Callable[[Any], Any] | None:
    """How decoded data becomes a field's value on the fast path (``None``: as it is). Data
    Avro decoded with the record's own schema (``typed``) holds the fields' types: only its
    enum symbols and containers need converting, and a null takes a field's default."""
    if isinstance(f, CustomEnum):
        return _EnumIn(k, f, typed=typed).__getitem__
    if isinstance(f, Record) or f.converts:
        return lambda v: f.validate_type(k, f.from_data(v))
    if typed and not f._required and (m := f.default()) is not None:
        return lambda v: m if v is None else v
    return None


def _given(k: str, f: Field | Record) -> Callable[[Any], Any]:
    """How any value given for a field becomes its value (the slow path)."""
    if isinstance(f, CustomEnum):
        lookup, enum_type, check = f.lookup, f.enum_type, f.validate_type

        def member(v: Any) -> Any:
            if type(v) is enum_type:
                return v
            m = lookup.get(v) if type(v) is str or type(v) is int else None
            return m if m is not None else check(k, v)

        return member
    if isinstance(f, Record) or f.converts:
        return lambda v: f.validate_type(k, f.from_data(v))
    exact, check = f.exact, f.validate_type
    return lambda v: v if type(v) in exact else check(k, v)


def _make_builder(cls: type[Record], *, typed: bool) -> Callable[[dict[str, Any]], Any]:
    """A function building a ``cls`` instance from decoded data, as ``Record._from_data``
    specifies, built once per class (this keeps decoding a record close to the cost of
    decoding its data).

    The fast path takes data holding exactly the record's fields: the dict (the decoder's
    own, changed in place) becomes the instance's attributes, enums are looked up by symbol
    or value and containers and sub-records converted; a value must be of one of its
    field's exact types (a JSON value may be anything), unless ``typed``: data Avro decoded
    with the record's own schema, whose types are the fields' by construction, so only a
    null taking a field's default remains. Anything else takes the slow path: each value
    through its field's full check.
    """
    new, setattr_ = object.__new__, object.__setattr__
    keys = frozenset(cls._fields)
    # The slow path: (name, value when missing, conversion of a value given).
    slow_steps: list[tuple[str, Any, Callable[[Any], Any]]] = []
    checks: list[tuple[str, frozenset[Any]]] = []  # fast path, untyped: exact types
    fixes: list[tuple[str, Callable[[Any], Any]]] = []  # fast path: conversions
    for k, f, conv in cls._plan():
        if isinstance(f, Record):
            missing = f.default() if f._default is not None else f
        else:
            missing = f.default()
        slow_steps.append((k, missing, _given(k, f)))
        if not typed and (isinstance(f, CustomEnum) or not conv):
            checks.append((k, _ENUM_DATA if isinstance(f, CustomEnum) else f.exact))
        fix = _value_in(k, f, typed=typed)
        if fix is not None:
            fixes.append((k, fix))

    def slow(data: dict[str, Any]) -> Any:
        get = data.get
        values: dict[str, Any] = {"_default": None, "_required_default": False, "_required": False}
        for k, missing, given in slow_steps:
            v = get(k, _MISSING)
            values[k] = missing if v is _MISSING else given(v)
        obj = new(cls)
        setattr_(obj, "__dict__", values)
        return obj

    def build(d: dict[str, Any]) -> Any:
        if d.keys() != keys:
            return slow(d)
        for k, exact in checks:
            if type(d[k]) not in exact:
                return slow(d)
        for k, fix in fixes:
            d[k] = fix(d[k])
        obj = new(cls)
        obj.__dict__.update(d)
        return obj

    def build_typed(d: dict[str, Any]) -> Any:
        for k, fix in fixes:
            d[k] = fix(d[k])
        obj = new(cls)
        obj.__dict__.update(d)
        return obj

    def build_typed_as_is(d: dict[str, Any]) -> Any:
        obj = new(cls)
        obj.__dict__.update(d)
        return obj

    if not typed:
        return build
    return build_typed if fixes else build_typed_as_is
