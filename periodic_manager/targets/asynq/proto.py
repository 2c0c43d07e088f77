"""asynq's protobuf messages, built here from a schema written in code (no ``protoc``, no file
generated): :data:`TaskMessage` (a task as asynq stores it), :data:`SchedulerEntry` (what a
scheduler publishes of each registered entry) and :data:`SchedulerEnqueueEvent` (one line of an
entry's history).

The field names, numbers and types are asynq's (``internal/proto/asynq.proto``, the same in
v0.24 to v0.26 but for ``headers``, field 15, added in v0.25: written only with ``PM_OTEL``
(the ``traceparent``), and a v0.24 server skips it as an unknown field). The messages live in a descriptor pool of their own, so
they never meet another ``asynq`` package a program may have loaded into the default pool.

Needs the ``asynq`` extra (``protobuf``); imported by the target when it is built, never by the
settings.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_STRING, _BYTES, _INT32, _INT64, _MESSAGE = (
    _F.TYPE_STRING,
    _F.TYPE_BYTES,
    _F.TYPE_INT32,
    _F.TYPE_INT64,
    _F.TYPE_MESSAGE,
)
_TIMESTAMP = ".google.protobuf.Timestamp"

# (name, number, type, label, message type): asynq.proto, message by message.
_MESSAGES: dict[str, list[tuple[str, int, int, int, str | None]]] = {
    "TaskMessage": [
        ("type", 1, _STRING, _OPTIONAL, None),
        ("payload", 2, _BYTES, _OPTIONAL, None),
        ("headers", 15, _MESSAGE, _REPEATED, ".asynq.TaskMessage.HeadersEntry"),
        ("id", 3, _STRING, _OPTIONAL, None),
        ("queue", 4, _STRING, _OPTIONAL, None),
        ("retry", 5, _INT32, _OPTIONAL, None),
        ("retried", 6, _INT32, _OPTIONAL, None),
        ("error_msg", 7, _STRING, _OPTIONAL, None),
        ("last_failed_at", 11, _INT64, _OPTIONAL, None),
        ("timeout", 8, _INT64, _OPTIONAL, None),
        ("deadline", 9, _INT64, _OPTIONAL, None),
        ("unique_key", 10, _STRING, _OPTIONAL, None),
        ("group_key", 14, _STRING, _OPTIONAL, None),
        ("retention", 12, _INT64, _OPTIONAL, None),
        ("completed_at", 13, _INT64, _OPTIONAL, None),
    ],
    "SchedulerEntry": [
        ("id", 1, _STRING, _OPTIONAL, None),
        ("spec", 2, _STRING, _OPTIONAL, None),
        ("task_type", 3, _STRING, _OPTIONAL, None),
        ("task_payload", 4, _BYTES, _OPTIONAL, None),
        ("enqueue_options", 5, _STRING, _REPEATED, None),
        ("next_enqueue_time", 6, _MESSAGE, _OPTIONAL, _TIMESTAMP),
        ("prev_enqueue_time", 7, _MESSAGE, _OPTIONAL, _TIMESTAMP),
    ],
    "SchedulerEnqueueEvent": [
        ("task_id", 1, _STRING, _OPTIONAL, None),
        ("enqueue_time", 2, _MESSAGE, _OPTIONAL, _TIMESTAMP),
    ],
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    """The schema as one proto3 file, package ``asynq``."""
    file = descriptor_pb2.FileDescriptorProto(
        name="periodic_manager/asynq.proto",
        package="asynq",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            added = message.field.add(name=field, number=number, type=kind, label=label)
            if type_name is not None:
                added.type_name = type_name
        if name == "TaskMessage":  # map<string, string> headers: its entry type, as protoc makes it
            entry = message.nested_type.add(name="HeadersEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=_STRING, label=_OPTIONAL)
            entry.field.add(name="value", number=2, type=_STRING, label=_OPTIONAL)
    return file


def _classes() -> tuple[Any, Any, Any]:
    pool = descriptor_pool.DescriptorPool()
    timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    pool.Add(timestamp)
    pool.Add(_file())
    return tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"asynq.{name}"))
        for name in _MESSAGES
    )


TaskMessage, SchedulerEntry, SchedulerEnqueueEvent = _classes()
