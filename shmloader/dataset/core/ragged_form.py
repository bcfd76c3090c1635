"""What a batch holds for a variable-length list column: ``SharedTaskDataset(ragged=...)``.

A value, checked once with the dataset's options and carried by the gather (and the
DataLoader workers' copies of it); the gather itself is ``gather/ragged.py``, which says what
each form gives. No torch here: the options and the book load without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast, get_args

from ...errors import ConfigError

Ragged = Literal["list", "padded", "offsets"]
RAGGED_CHOICES: tuple[str, ...] = get_args(Ragged)
SUFFIX: dict[str, str] = {"padded": "_lengths", "offsets": "_offsets"}


@dataclass(frozen=True)
class RaggedForm:
    """How a batch holds variable-length list columns (gather/ragged.py says what each form
    gives)."""

    form: Ragged = "list"
    pad_value: int | float = 0

    @classmethod
    def checked(cls, form: object, pad_value: object) -> RaggedForm:
        """The form, or a ConfigError that names the choices."""
        if form not in RAGGED_CHOICES:
            raise ConfigError(
                f"ragged must be one of {', '.join(map(repr, RAGGED_CHOICES))}, got {form!r}"
            )
        if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
            raise ConfigError(f"pad_value must be a number, got {pad_value!r}")
        return cls(cast(Ragged, form), pad_value)

    def extra_column(self, name: str) -> str | None:
        """The second column a batch gets for list column ``name`` (None for ``"list"``)."""
        suffix = SUFFIX.get(self.form)
        return None if suffix is None else name + suffix


LISTS = RaggedForm()  # the default: variable-length lists as lists of tensors
