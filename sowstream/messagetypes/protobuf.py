"""``protobuf``: messages of one protobuf message type, named by the topic's ``Schema``.

``Schema`` names a descriptor set (``protoc --include_imports --descriptor_set_out=FILE``; any
name not ending in ``.proto``) or a ``.proto`` file, which is compiled to one with grpcio-tools
(its folder is the import path); ``#package.Message`` after the file name chooses the message
type, otherwise the file's first message is used. Messages are built dynamically from the
descriptors with the ``protobuf`` package, so no generated code is needed.

A parsed body holds the fields the message has (set fields, for proto3 the non-default ones):
nested messages as dicts, repeated fields as lists, maps as dicts, enums by value name, bytes as
bytes. Paths are field names (``/customer/name``).

Deltas, as the delta chapter says: a proto2 (or editions) schema tracks which fields are present,
so a delta_publish carries just the fields it updates and a delta subscription receives only the
changed fields (nested messages field by field; repeated and map fields whole). A proto3 schema
cannot tell an unset field from a default one: delta subscriptions get whole messages and a
delta_publish replaces the record.
"""

from __future__ import annotations

import base64
import binascii
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError, Message

from sowstream.messagetypes.base import (
    MessageParseError,
    MessageSerialiseError,
    MessageType,
    MessageTypeConfigError,
    TypeOptions,
)
from sowstream.messagetypes.changes import changed_fields


class ProtobufType(MessageType):
    """One protobuf message type from a descriptor set; see the module docstring for deltas."""

    name: ClassVar[str] = "protobuf"

    def __init__(self, options: TypeOptions | None = None) -> None:
        super().__init__(options)
        descriptor_set, wanted = _descriptor_set(self.options)
        where = f"topic {self.options.topic!r}" if self.options.topic else "protobuf"
        try:
            files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
            pool = descriptor_pool.DescriptorPool()
            for file in files.file:
                pool.Add(file)
        except Exception as exc:  # DecodeError, TypeError for a set missing its imports...
            raise MessageTypeConfigError(
                f"{where}: not a usable protobuf descriptor set ({type(exc).__name__}: {exc}); "
                "make one with protoc --include_imports --descriptor_set_out=FILE"
            ) from None
        if not wanted:
            first = next((f for f in reversed(files.file) if f.message_type), None)
            if first is None:
                raise MessageTypeConfigError(f"{where}: the protobuf schema has no message type")
            package = f"{first.package}." if first.package else ""
            wanted = package + first.message_type[0].name
        try:
            self.descriptor: Descriptor = pool.FindMessageTypeByName(wanted)
        except KeyError:
            raise MessageTypeConfigError(
                f"{where}: the protobuf schema has no message type {wanted!r}"
            ) from None
        self._class = message_factory.GetMessageClass(self.descriptor)
        syntax = next(
            (f.syntax for f in files.file if f.name == self.descriptor.file.name), "proto2"
        )
        self.syntax = syntax or "proto2"
        self.supports_delta = self.syntax != "proto3"
        self.schema_text = orjson.dumps(
            {"descriptor_set": base64.b64encode(descriptor_set).decode(), "message": wanted}
        ).decode()

    def parse(self, data: bytes) -> dict[str, Any]:
        message = self._class()
        try:
            message.ParseFromString(data)
        except DecodeError as exc:
            problem = f"not a {self.descriptor.full_name} message ({exc})"
            raise MessageParseError("protobuf", problem) from None
        return _fields(message)

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        message = self._class()
        _fill(message, record)
        try:
            # Partial: a delta (and a record from a partial delta) may leave required fields out.
            return bytes(message.SerializePartialToString())
        except EncodeError as exc:
            raise MessageSerialiseError(
                f"cannot write {self.descriptor.full_name}: {exc}"
            ) from None

    def changed(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
        # A removed field has no protobuf form (no null): it is left out of the delta.
        return _without_nulls(changed_fields(before, after))


def _without_nulls(delta: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: _without_nulls(v) if isinstance(v, Mapping) else v
        for k, v in delta.items()
        if v is not None
    }


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    return value


def _fields(message: Message) -> dict[str, Any]:
    """The fields ``message`` has, as a dict (nested messages as dicts, enums by name)."""
    body: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            body[field.name] = {
                k: _fields(v) if value_field.message_type is not None else _scalar(value_field, v)
                for k, v in value.items()
            }
        elif field.is_repeated:
            body[field.name] = [
                _fields(v) if field.message_type is not None else _scalar(field, v) for v in value
            ]
        elif field.message_type is not None:
            body[field.name] = _fields(value)
        else:
            body[field.name] = _scalar(field, value)
    return body


def _fill(message: Message, record: Mapping[str, Any]) -> None:
    """Set ``record``'s fields on ``message``; MessageSerialiseError naming a field that does not
    fit (unknown, wrong type, nested where a scalar belongs)."""
    descriptor = message.DESCRIPTOR
    for name, value in record.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            raise MessageSerialiseError(
                f"{descriptor.full_name} has no field {name!r} (it has "
                f"{', '.join(f.name for f in descriptor.fields)})"
            )
        if value is None:
            continue  # no protobuf form: the field is simply not present
        try:
            _set(message, field, value)
        except (TypeError, ValueError) as exc:
            raise MessageSerialiseError(
                f"field {descriptor.full_name}.{name} cannot hold {value!r}: {exc}"
            ) from None


def _set(message: Message, field: FieldDescriptor, value: Any) -> None:
    target = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        for key, item in _mapping(field, value).items():
            if value_field.message_type is not None:
                _fill(target[key], _mapping(value_field, item))
            else:
                target[key] = _to_scalar(value_field, item)
    elif field.is_repeated:
        if not isinstance(value, list | tuple):
            value = [value]
        for item in value:
            if field.message_type is not None:
                _fill(target.add(), _mapping(field, item))
            else:
                target.append(_to_scalar(field, item))
    elif field.message_type is not None:
        _fill(target, _mapping(field, value))
        if not value:
            target.SetInParent()  # an empty nested message is still present
    else:
        setattr(message, field.name, _to_scalar(field, value))


def _mapping(field: FieldDescriptor, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{field.name} is a message or map field and needs an object")
    return value


def _to_scalar(field: FieldDescriptor, value: Any) -> Any:
    """Text from filters and enrichment made to fit the field: numbers written as text, enums."""
    kind = field.cpp_type
    if isinstance(value, Mapping | list | tuple):
        raise TypeError("a scalar field cannot hold an object or a list")
    if kind == FieldDescriptor.CPPTYPE_ENUM and isinstance(value, str):
        known = field.enum_type.values_by_name.get(value)
        if known is None:
            raise ValueError(f"{value!r} is not a value of enum {field.enum_type.full_name}")
        return known.number
    integral = (
        FieldDescriptor.CPPTYPE_INT32,
        FieldDescriptor.CPPTYPE_INT64,
        FieldDescriptor.CPPTYPE_UINT32,
        FieldDescriptor.CPPTYPE_UINT64,
    )
    if kind in integral and isinstance(value, str | float) and not isinstance(value, bool):
        number = float(value)
        if not number.is_integer():
            raise ValueError("not a whole number")
        return int(number)
    if kind in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT) and isinstance(
        value, str | int
    ):
        return float(value)
    if kind == FieldDescriptor.CPPTYPE_STRING and field.type == FieldDescriptor.TYPE_BYTES:
        return value.encode() if isinstance(value, str) else value
    return value


def _descriptor_set(options: TypeOptions) -> tuple[bytes, str]:
    """The serialised FileDescriptorSet and the message type asked for ("" for the first)."""
    where = f"topic {options.topic!r}" if options.topic else "protobuf"
    if options.schema is not None:  # as the engine published it on the meta topic
        try:
            given = orjson.loads(options.schema)
            return base64.b64decode(given["descriptor_set"], validate=True), given["message"]
        except (orjson.JSONDecodeError, KeyError, TypeError, binascii.Error):
            raise MessageTypeConfigError(f"{where}: the protobuf schema is malformed") from None
    if not options.schema_file:
        raise MessageTypeConfigError(
            f"{where}: a protobuf topic needs its schema: give a descriptor set or .proto file "
            "as Schema (with #package.Message to choose the message type)"
        )
    file, _, wanted = options.schema_file.partition("#")
    path = Path(file)
    if path.suffix == ".proto":
        return _compile(path, where), wanted.strip()
    try:
        return path.read_bytes(), wanted.strip()
    except OSError as exc:
        raise MessageTypeConfigError(
            f"{where}: cannot read the protobuf descriptor set {file!r}: {exc.strerror or exc}"
        ) from None


def _compile(proto: Path, where: str) -> bytes:
    """``proto`` compiled to a descriptor set with grpcio-tools (imports from its folder)."""
    if not proto.is_file():
        raise MessageTypeConfigError(f"{where}: cannot read the .proto file {str(proto)!r}")
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise MessageTypeConfigError(
            f"{where}: compiling {proto.name} needs grpcio-tools (pip install grpcio-tools); or "
            "give a descriptor set made with protoc --include_imports --descriptor_set_out=FILE"
        ) from None
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "schema.desc"
        args = [
            "protoc",
            f"-I{proto.parent}",
            f"-I{well_known}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            str(proto),
        ]
        if protoc.main(args) != 0 or not out.is_file():
            raise MessageTypeConfigError(
                f"{where}: {str(proto)!r} does not compile (protoc printed why above)"
            )
        return out.read_bytes()
