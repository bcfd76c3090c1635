"""``ds.stats()``: what a trainer delivered, how long its loop waited, and its processes' memory
(docs/dataset.md, "Stats"; docs/architecture.md for the parts)."""
