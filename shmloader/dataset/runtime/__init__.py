"""A started dataset: its master, readers, store, maintenance, auto scaling and close."""
