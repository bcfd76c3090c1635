"""What the master's client and server agree on beyond the protobuf schema.

Kept apart from :mod:`.service` so that a reader process, which only ever talks to a master,
imports the client without the server side (dispatcher, journal updates, epochs): a reader's
start-up is on the path to a dataset's first batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Trailing metadata telling the client *why* a request was refused, where it can act on it.
REASON_KEY = "shmloader-reason"
UNKNOWN_CONSUMER = "unknown-consumer"

# Bounds on what one request may carry: anything larger is a bug or an attack, not a workload.
MAX_ID_CHARS = 256
MAX_ERROR_CHARS = 16_384
MAX_TASKS_PER_CALL = 4096
MAX_IDS_PER_CALL = 65_536  # lease ids in one renew or complete
MAX_EPOCH = 2**40
# Requests are small; a huge one is refused by gRPC itself before it is parsed.
MAX_REQUEST_BYTES = 4 * 1024 * 1024

# What a leaving trainer hands back (``Leave``): lease id -> record ranges ``[start, stop)``
# consumed of its task (see :mod:`.handback`).
HandBack = Mapping[int, Sequence[Sequence[int]]]
