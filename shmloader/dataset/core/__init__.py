"""Values every layer of the trainer side reads: sample indices, ready tasks, record ranges,
batches, receipts, and the protocols of the master and the store."""
