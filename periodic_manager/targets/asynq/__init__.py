"""The asynq target: tasks for Go workers running an unmodified ``asynq.Server``.

``message`` (a slot as asynq's client would enqueue it, and the write-time rule), ``proto``
(asynq's protobuf messages from a schema written here), ``scheduler`` (what asynq's tools read of
a scheduler) and ``target`` (the claim-and-enqueue script, the state signals, the announcements).
"""
