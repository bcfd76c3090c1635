"""gRPC settings that must be in place before ``grpc`` is first imported.

DataLoader workers are forked from a trainer whose gRPC threads (the embedded master, the
client's heartbeat) are busy; the children never use gRPC, so its fork handlers only print
"Other threads are currently calling into gRPC, skipping fork() handlers" on every fork. A
user who sets the variable keeps their choice.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
