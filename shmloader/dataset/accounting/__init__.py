"""Exactly-once: the consumption book, the data plane around it, what goes to the master."""
