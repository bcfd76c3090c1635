"""Checkpoints: the saved state, the resume point a loaded one becomes, the hand-over."""
