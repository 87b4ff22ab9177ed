"""The schema of a part: which Arrow types a part can hold, and their JSON form in the footer.

Invariants:
- `schema_to_json` and `schema_from_json` are inverse on every schema `normalize_schema`
  accepts: names, types, nullability, field metadata and schema metadata come back equal, in
  the same order (`pa.Schema.equals(..., check_metadata=True)`).
- The JSON form is a plain tree of dicts, lists, strings, integers, booleans and nulls, so
  the footer can be serialized deterministically (sorted keys, no floats).
- `normalize_schema` is the one place deciding what is storable. Dictionary types are
  stored decoded (their value type); extension, union, view and run-end encoded types are
  rejected with `InvalidUpdates`, because a reader could not rebuild them exactly.

Assumes: metadata keys and values are UTF-8 text (Spark writes JSON text there); other bytes
are rejected rather than silently re-encoded.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from persistshard.errors import InvalidUpdates

_SIMPLE: dict[str, pa.DataType] = {
    "null": pa.null(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "date32": pa.date32(),
    "date64": pa.date64(),
    "interval_mdn": pa.month_day_nano_interval(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "string": pa.string(),
    "large_string": pa.large_string(),
}
_SIMPLE_NAMES: dict[pa.DataType, str] = {t: name for name, t in _SIMPLE.items()}

_DECIMALS: dict[int, Any] = {
    128: pa.decimal128,
    256: pa.decimal256,
}
if hasattr(pa, "decimal32"):  # pyarrow >= 18
    _DECIMALS[32] = pa.decimal32
    _DECIMALS[64] = pa.decimal64

_UNITS = ("s", "ms", "us", "ns")


def _unsupported(t: pa.DataType, where: str) -> InvalidUpdates:
    return InvalidUpdates(
        f"column {where!r} has Arrow type {t}, which a part cannot store exactly; "
        "cast it to a plain type (string, binary, list, struct, ...) before writing"
    )


def _check_metadata(meta: dict[bytes, bytes] | None, where: str) -> None:
    if not meta:
        return
    for k, v in meta.items():
        try:
            k.decode("utf-8")
            v.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidUpdates(
                f"metadata of {where!r} holds non-UTF-8 bytes (key {k!r}); "
                "parts store metadata as UTF-8 text"
            ) from None


def _normalize_type(t: pa.DataType, where: str) -> pa.DataType:
    if isinstance(t, pa.BaseExtensionType):
        raise _unsupported(t, where)
    if pa.types.is_dictionary(t):
        return _normalize_type(t.value_type, where)
    if t in _SIMPLE_NAMES:
        return t
    if pa.types.is_decimal(t):
        if t.bit_width not in _DECIMALS:
            raise _unsupported(t, where)
        return t
    if (
        pa.types.is_timestamp(t)
        or pa.types.is_time(t)
        or pa.types.is_duration(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return t
    if pa.types.is_map(t):
        key = _normalize_field(t.key_field, f"{where}.key")
        item = _normalize_field(t.item_field, f"{where}.value")
        return pa.map_(key, item, keys_sorted=t.keys_sorted)
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_normalize_field(t.value_field, f"{where}[]"), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(_normalize_field(t.value_field, f"{where}[]"))
    if pa.types.is_list(t):
        return pa.list_(_normalize_field(t.value_field, f"{where}[]"))
    if pa.types.is_struct(t):
        return pa.struct(
            [
                _normalize_field(t.field(i), f"{where}.{t.field(i).name}")
                for i in range(t.num_fields)
            ]
        )
    raise _unsupported(t, where)


def _normalize_field(f: pa.Field, where: str) -> pa.Field:
    _check_metadata(f.metadata, where)
    t = _normalize_type(f.type, where)
    return f if t is f.type or t.equals(f.type) else f.with_type(t)


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a part stores for `schema`: dictionaries decoded, everything else as given.

    Raises `InvalidUpdates` for types a part cannot store exactly, duplicate column names
    and non-UTF-8 metadata.
    """
    names = schema.names
    if len(set(names)) != len(names):
        raise InvalidUpdates(f"duplicate column names in {names}; a part needs unique names")
    _check_metadata(schema.metadata, "<schema>")
    fields = [_normalize_field(f, f.name) for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def decoded_type(t: pa.DataType) -> pa.DataType:
    """`t` with every dictionary replaced by its value type (what a part stores)."""
    return _normalize_type(t, "<column>")


def has_dictionary(t: pa.DataType) -> bool:
    """Whether `t` is or contains a dictionary type (then arrays must be cast before writing)."""
    if pa.types.is_dictionary(t):
        return True
    return any(has_dictionary(t.field(i).type) for i in range(t.num_fields))


# ---------------------------------------------------------------------------------------------
# JSON form


def _meta_to_json(meta: dict[bytes, bytes] | None) -> list[list[str]] | None:
    if meta is None:
        return None
    return [[k.decode("utf-8"), v.decode("utf-8")] for k, v in meta.items()]


def _meta_from_json(obj: Any) -> dict[bytes, bytes] | None:
    if obj is None:
        return None
    if not isinstance(obj, list):
        raise ValueError("metadata must be a list of pairs")
    out: dict[bytes, bytes] = {}
    for pair in obj:
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)
        ):
            raise ValueError("metadata entries must be [key, value] string pairs")
        out[pair[0].encode("utf-8")] = pair[1].encode("utf-8")
    return out


def type_to_json(t: pa.DataType) -> dict[str, Any]:
    """The JSON object describing a normalized Arrow type (see docs/format.md, "Types")."""
    name = _SIMPLE_NAMES.get(t)
    if name is not None:
        return {"type": name}
    if pa.types.is_decimal(t):
        return {"type": "decimal", "bits": t.bit_width, "precision": t.precision, "scale": t.scale}
    if pa.types.is_timestamp(t):
        return {"type": "timestamp", "unit": t.unit, "tz": t.tz}
    if pa.types.is_time32(t):
        return {"type": "time32", "unit": t.unit}
    if pa.types.is_time64(t):
        return {"type": "time64", "unit": t.unit}
    if pa.types.is_duration(t):
        return {"type": "duration", "unit": t.unit}
    if pa.types.is_fixed_size_binary(t):
        return {"type": "fixed_binary", "width": t.byte_width}
    if pa.types.is_map(t):
        return {
            "type": "map",
            "key": field_to_json(t.key_field),
            "item": field_to_json(t.item_field),
            "keys_sorted": t.keys_sorted,
        }
    if pa.types.is_fixed_size_list(t):
        return {"type": "fixed_list", "size": t.list_size, "child": field_to_json(t.value_field)}
    if pa.types.is_large_list(t):
        return {"type": "large_list", "child": field_to_json(t.value_field)}
    if pa.types.is_list(t):
        return {"type": "list", "child": field_to_json(t.value_field)}
    if pa.types.is_struct(t):
        return {
            "type": "struct",
            "children": [field_to_json(t.field(i)) for i in range(t.num_fields)],
        }
    raise InvalidUpdates(f"Arrow type {t} is not storable in a part")


def field_to_json(f: pa.Field) -> dict[str, Any]:
    """The JSON object describing a field: name, nullable, type, metadata."""
    return {
        "name": f.name,
        "nullable": f.nullable,
        "type": type_to_json(f.type),
        "metadata": _meta_to_json(f.metadata),
    }


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """The JSON object describing a normalized schema: its fields and metadata."""
    return {
        "fields": [field_to_json(f) for f in schema],
        "metadata": _meta_to_json(schema.metadata),
    }


def _get(obj: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"missing {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key!r} has the wrong JSON type")
    return value


def _unit(obj: Any, allowed: tuple[str, ...] = _UNITS) -> str:
    unit = _get(obj, "unit", str)
    if unit not in allowed:
        raise ValueError(f"bad time unit {unit!r}")
    return str(unit)


def type_from_json(obj: Any) -> pa.DataType:
    """Inverse of `type_to_json`; raises ValueError on anything malformed."""
    name = _get(obj, "type", str)
    simple = _SIMPLE.get(name)
    if simple is not None:
        return simple
    if name == "decimal":
        bits = _get(obj, "bits", int)
        if bits not in _DECIMALS:
            raise ValueError(f"bad decimal width {bits}")
        decimal: pa.DataType = _DECIMALS[bits](_get(obj, "precision", int), _get(obj, "scale", int))
        return decimal
    if name == "timestamp":
        tz = obj.get("tz")
        if tz is not None and not isinstance(tz, str):
            raise ValueError("bad time zone")
        return pa.timestamp(_unit(obj), tz=tz)
    if name == "time32":
        return pa.time32(_unit(obj, ("s", "ms")))
    if name == "time64":
        return pa.time64(_unit(obj, ("us", "ns")))
    if name == "duration":
        return pa.duration(_unit(obj))
    if name == "fixed_binary":
        return pa.binary(_get(obj, "width", int))
    if name == "map":
        return pa.map_(
            field_from_json(_get(obj, "key", dict)),
            field_from_json(_get(obj, "item", dict)),
            keys_sorted=_get(obj, "keys_sorted", bool),
        )
    if name == "fixed_list":
        size = _get(obj, "size", int)
        if size < 0:
            raise ValueError("negative list size")
        return pa.list_(field_from_json(_get(obj, "child", dict)), size)
    if name == "large_list":
        return pa.large_list(field_from_json(_get(obj, "child", dict)))
    if name == "list":
        return pa.list_(field_from_json(_get(obj, "child", dict)))
    if name == "struct":
        return pa.struct([field_from_json(c) for c in _get(obj, "children", list)])
    raise ValueError(f"unknown type {name!r}")


def field_from_json(obj: Any) -> pa.Field:
    """Inverse of `field_to_json`; raises ValueError on anything malformed."""
    return pa.field(
        _get(obj, "name", str),
        type_from_json(_get(obj, "type", dict)),
        nullable=_get(obj, "nullable", bool),
        metadata=_meta_from_json(obj.get("metadata")),
    )


def schema_from_json(obj: Any) -> pa.Schema:
    """Inverse of `schema_to_json`; raises ValueError on anything malformed."""
    fields = [field_from_json(f) for f in _get(obj, "fields", list)]
    return pa.schema(
        fields, metadata=_meta_from_json(obj.get("metadata") if isinstance(obj, dict) else None)
    )
