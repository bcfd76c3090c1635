"""Grain's decode step for ``_bench_peers.grain_loader``, in a module of its own: Grain's
worker processes unpickle it by module path, and this module imports Grain at the top."""

from __future__ import annotations

from typing import Any

import grain.python as grain
from _bench_decoders import Layout


class Decode(grain.MapTransform):
    """One record's payload to its decoded dict (``Layout.decode``)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def map(self, element: bytes) -> dict[str, Any]:
        return self.layout.decode(element)
