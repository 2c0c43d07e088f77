"""What the claim scripts say of each task: one set of flags for every Lua script that claims a
slot (``redis/scripts/claim.lua``, ``celery/scripts/claim_and_push.lua``,
``scripts/arq_claim_and_write.lua``, ``redis/scripts/claim_and_add*.lua``,
``asynq/scripts/asynq_claim_and_enqueue.lua``). Each script declares
the same numbers under the same names at its top and says which of them it returns.
"""

from __future__ import annotations

SENT = 0  # the slot was sent already: a duplicate (nothing written)
NEW = 1  # claimed now (and, where the script writes the message too, written)
BUSY = 2  # options.overlap: the schedule's previous task is not finished or changed since it
#           was read (nothing written)
RESEND = 3  # a pending claim of ours, or an abandoned one, taken again: sent again, same task id
ELSEWHERE = 4  # another publisher's pending claim, recent: nothing written, ask again later
UNROUTABLE = 5  # Celery on Redis: no queue is bound to the exchange and routing key
WRONGTYPE = 6  # a key the task reads (its claim, its schedule's previous-task key) holds another
#                Redis type: nothing written for that task, the others go on
UNIQUE = 7  # asynq: its uniqueness lock (options.unique_ttl) is held by another task, so asynq's
#             client would not enqueue it either: nothing written, no claim


def wrong_type(what: str, *keys: str) -> str:
    """The error of a task flagged WRONGTYPE; ``keys``: the keys it may be."""
    return f"{what}: {' or '.join(keys)} holds another Redis type (nothing written for this slot)"
