"""Indices to tensors: the gather, the worker's view of the store, the ring and the ledger."""
