"""Flink's JSON form of a failure (`SerializedThrowable`), which the real `flink` CLI can read.

Flink answers a failed asynchronous operation with
``{"class": ..., "stack-trace": ..., "serialized-throwable": <base64>}``, and its REST client
rebuilds the exception from "serialized-throwable" with Java deserialization: anything else in
that field makes `flink savepoint` die on a JSON error instead of printing why the savepoint
failed. So the field holds a minimal Java serialization stream of an
`org.apache.flink.util.SerializedThrowable` (the class's serialVersionUID, its two String fields
and Throwable's message); Java fills every field the stream leaves out with its default.

Pure: text in, bytes out (the format is the Java Object Serialization Stream Protocol).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

_MAGIC = b"\xac\xed\x00\x05"
_TC_NULL, _TC_CLASSDESC, _TC_OBJECT, _TC_STRING, _TC_ENDBLOCKDATA, _TC_LONGSTRING = (0x70, 0x72, 0x73, 0x74, 0x78, 0x7C)
_SC_WRITE_METHOD, _SC_SERIALIZABLE = 0x01, 0x02

SERIALIZED_THROWABLE = "org.apache.flink.util.SerializedThrowable"
_SERIALIZED_THROWABLE_UID = 7284183123441947635
_EXCEPTION_UID = -3387516993124229948
_THROWABLE_UID = -3042686055658047285
_STRING = "Ljava/lang/String;"


def _modified_utf8(text: str) -> bytes:
    """Java's modified UTF-8: UTF-16 code units, NUL as two bytes, no 4-byte sequences."""
    units = text.encode("utf-16-be", "surrogatepass")
    out = bytearray()
    for (unit,) in struct.iter_unpack(">H", units):
        if 0 < unit < 0x80:
            out.append(unit)
        elif unit < 0x800:
            out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:
            out += bytes((0xE0 | unit >> 12, 0x80 | unit >> 6 & 0x3F, 0x80 | unit & 0x3F))
    return bytes(out)


def _utf(text: str) -> bytes:
    data = _modified_utf8(text)
    return struct.pack(">H", len(data)) + data


def _string(text: str) -> bytes:
    data = _modified_utf8(text)
    if len(data) <= 0xFFFF:
        return bytes((_TC_STRING,)) + struct.pack(">H", len(data)) + data
    return bytes((_TC_LONGSTRING,)) + struct.pack(">q", len(data)) + data


def _class_desc(name: str, uid: int, flags: int, fields: list[tuple[str, str]], superclass: bytes) -> bytes:
    out = bytes((_TC_CLASSDESC,)) + _utf(name) + struct.pack(">qB", uid, flags) + struct.pack(">H", len(fields))
    for field_name, signature in fields:  # object fields only: type code, name, type string
        out += signature[0].encode() + _utf(field_name) + _string(signature)
    return out + bytes((_TC_ENDBLOCKDATA,)) + superclass


def serialized_throwable(class_name: str, message: str | None, stack_trace: str) -> bytes:
    """A Java-serialized `SerializedThrowable` whose toString() is "class_name: message" and whose
    printStackTrace() prints `stack_trace`."""
    throwable = _class_desc(
        "java.lang.Throwable",
        _THROWABLE_UID,
        _SC_SERIALIZABLE | _SC_WRITE_METHOD,
        [("detailMessage", _STRING)],
        bytes((_TC_NULL,)),
    )
    exception = _class_desc("java.lang.Exception", _EXCEPTION_UID, _SC_SERIALIZABLE, [], throwable)
    desc = _class_desc(
        SERIALIZED_THROWABLE,
        _SERIALIZED_THROWABLE_UID,
        _SC_SERIALIZABLE,
        [("fullStringifiedStackTrace", _STRING), ("originalErrorClassName", _STRING), ("serializedException", "[B")],
        exception,
    )
    # Class data goes from the top superclass down; Throwable's writeObject data ends with a block end.
    data = (_string(message) if message is not None else bytes((_TC_NULL,))) + bytes((_TC_ENDBLOCKDATA,))
    data += _string(stack_trace) + _string(class_name) + bytes((_TC_NULL,))
    return _MAGIC + bytes((_TC_OBJECT,)) + desc + data


def failure_cause(class_name: str, message: str, stack_trace: str | None = None) -> dict[str, Any]:
    """Flink's JSON form of a SerializedThrowable (SerializedThrowableSerializer)."""
    trace = stack_trace if stack_trace else f"{class_name}: {message}"
    raw = serialized_throwable(class_name, message, trace)
    return {"class": class_name, "stack-trace": trace, "serialized-throwable": base64.b64encode(raw).decode("ascii")}
