"""Record files (TFRecord framing, indexes, compression) and ``tf.train.Example``
(docs/formats.md)."""
