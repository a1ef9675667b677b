"""The scalar field types a client schema's record declares (see
:mod:`filepulsar.connector.client.schema.record`): :class:`Field` and its boolean, number, bytes,
string, null and enum kinds; each checks its values and names its Avro type."""

from __future__ import annotations

import enum
from typing import Any, ClassVar


def type_name(t: Any) -> str:
    """A Python type (or a tuple of them) named for an error message: ``int or float``."""
    if isinstance(t, tuple):
        return " or ".join(type_name(x) for x in t)
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
                f"{type_name(self.accepts)}"
            )
        if not isinstance(val, self.accepts):
            raise TypeError(
                f"Invalid type '{type(val)}' for field '{name}'. Expected: "
                f"{type_name(self.accepts)}"
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
            raise TypeError(f"{type_name(enum_type)} is not a valid Enum type")
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
            f"Invalid type '{type(val)}' for field '{name}'. Expected: {type_name(self.enum_type)}"
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
