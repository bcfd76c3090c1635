"""Every task must give each column the same form in a batch: checked as tasks arrive.

A source of the user's own may return float32 for one task and float64 for the next, or images
of (3, 32, 32) and then (3, 64, 64). A batch drawing rows from both cannot be built, and a
batch drawn from one segment alone (``shuffle=False``, or a batch size that divides the task)
would silently have another dtype or shape than the one before it. So readers send the form of
every column with each segment (``Ready.forms``, from ``sources._tensor_types.gather_form``),
and the first task with rows sets what the rest must match; a task that differs is an error
naming both tasks (file and records), the column and both forms, raised in the loop before
any of its rows is handed out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ...errors import DataError
from ...reader.messages import Ready
from ...sources._tensor_types import NULLS, NUMBER_LISTS, forms_agree

log = logging.getLogger(__name__)

Form = tuple[bool, str]  # sources._tensor_types.gather_form


class FormCheck:
    """The column forms of the first task with rows, and the check of every later task.

    A column that task gave as nulls (type null) takes the form of the first task that gives
    it one; messages name the task that set the form they compare with."""

    def __init__(self, columns: Sequence[str] | None, *, ragged_given: bool = True) -> None:
        self._columns = None if columns is None else frozenset(columns)  # columns= of batches
        # ragged= left to its default: the first task with a variable-length list says so.
        self._log_lists = not ragged_given
        self._first: Ready | None = None
        self._known: dict[str, tuple[Form, Ready]] = {}  # column -> form, task that set it

    def check(self, ready: Ready) -> DataError | None:
        """None if ``ready``'s columns gather as the first task's did, else the error."""
        if ready.num_rows == 0 or not ready.forms:  # no rows: nothing of it reaches a batch
            return None
        forms = {
            name: (tensor, words)
            for name, tensor, words in ready.forms
            if self._columns is None or name in self._columns
        }
        if self._first is None:
            self._first = ready
            self._known = {name: (form, ready) for name, form in forms.items()}
            self._say_lists(forms)
            return None
        known = self._known
        if forms.keys() != known.keys():
            what = (
                f"has the columns {', '.join(forms)}, but {_task(self._first)} has "
                f"{', '.join(known)}"
            )
        else:
            differ = [name for name in forms if not forms_agree(forms[name], known[name][0])]
            if not differ:
                for name, form in forms.items():  # a column of nulls so far: now it has a form
                    if known[name][0][1] == NULLS:
                        known[name] = (form, ready)
                return None
            name = differ[0]
            (_tensor, words), setter = known[name]
            what = (
                f"gives column {name!r} as {forms[name][1]}, but {_task(setter)} gives it as "
                f"{words}"
            )
        return DataError(
            f"{_task(ready, with_path=False)} {what}, and a batch cannot hold both: a source "
            "must give every task the same columns, each of one type and row shape "
            '(docs/dataset.md, "Batches")',
            path=ready.path,
        )

    def _say_lists(self, forms: dict[str, Form]) -> None:
        """Say once what a batch holds for variable-length list columns, and the choices,
        when ``ragged=`` was not given: a list of tensors is not what a model takes."""
        lists = [name for name, (_, words) in forms.items() if words.startswith(NUMBER_LISTS)]
        if not lists or not self._log_lists:
            return
        self._log_lists = False
        log.warning(
            "column(s) %s hold lists whose length varies from record to record: each batch "
            "gives such a column as a list of 1-D tensors. SharedTaskDataset(ragged='padded') "
            "gives one padded tensor and a '<name>_lengths' column instead, ragged='offsets' "
            "the values and '<name>_offsets'; ragged='list' keeps the lists and says nothing "
            '(docs/dataset.md, "Variable-length columns"; logged once)',
            ", ".join(map(repr, lists)),
        )


def _task(ready: Ready, with_path: bool = True) -> str:
    where = f"{ready.path}, " if with_path else ""  # the error's own path is its prefix
    return (
        f"task {ready.task_id} (epoch {ready.epoch}, {where}records [{ready.start}, {ready.stop}))"
    )
