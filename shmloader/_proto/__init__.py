"""Generated protobuf/gRPC modules. Do not edit: run ``python scripts/gen_protos.py``."""
