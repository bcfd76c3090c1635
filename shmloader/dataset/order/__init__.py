"""The order rows are handed out in: the sampler, its batcher, how deliveries are told."""
