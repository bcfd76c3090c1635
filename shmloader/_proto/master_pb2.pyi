from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Whereabouts(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TODO: _ClassVar[Whereabouts]
    MINE: _ClassVar[Whereabouts]
    OTHER: _ClassVar[Whereabouts]
    DONE: _ClassVar[Whereabouts]
    QUARANTINED: _ClassVar[Whereabouts]
    TAKEN: _ClassVar[Whereabouts]
TODO: Whereabouts
MINE: Whereabouts
OTHER: Whereabouts
DONE: Whereabouts
QUARANTINED: Whereabouts
TAKEN: Whereabouts

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ("since_epoch",)
    SINCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    since_epoch: int
    def __init__(self, since_epoch: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("consumer", "rank")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    rank: int
    def __init__(self, consumer: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("consumer", "rank", "world_size", "lease_timeout", "consumer_timeout", "epochs", "num_tasks", "total_records", "paths", "records", "records_per_task")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RECORDS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_PER_TASK_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    rank: int
    world_size: int
    lease_timeout: float
    consumer_timeout: float
    epochs: int
    num_tasks: int
    total_records: int
    paths: _containers.RepeatedScalarFieldContainer[str]
    records: _containers.RepeatedScalarFieldContainer[int]
    records_per_task: int
    def __init__(self, consumer: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., lease_timeout: _Optional[float] = ..., consumer_timeout: _Optional[float] = ..., epochs: _Optional[int] = ..., num_tasks: _Optional[int] = ..., total_records: _Optional[int] = ..., paths: _Optional[_Iterable[str]] = ..., records: _Optional[_Iterable[int]] = ..., records_per_task: _Optional[int] = ...) -> None: ...

class ConsumerRequest(_message.Message):
    __slots__ = ("consumer", "figures")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    figures: TrainerFigures
    def __init__(self, consumer: _Optional[str] = ..., figures: _Optional[_Union[TrainerFigures, _Mapping]] = ...) -> None: ...

class TrainerFigures(_message.Message):
    __slots__ = ("records_consumed", "bytes_read", "batches", "loop_seconds", "loop_wait_seconds", "reader_wait_seconds", "shm_in_use_bytes", "shm_budget_bytes", "pss_bytes", "readers", "records_skipped", "bytes_consumed")
    class PssBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RECORDS_CONSUMED_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    LOOP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOOP_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    READER_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHM_IN_USE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHM_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    BYTES_CONSUMED_FIELD_NUMBER: _ClassVar[int]
    records_consumed: int
    bytes_read: int
    batches: int
    loop_seconds: float
    loop_wait_seconds: float
    reader_wait_seconds: float
    shm_in_use_bytes: int
    shm_budget_bytes: int
    pss_bytes: _containers.ScalarMap[str, int]
    readers: int
    records_skipped: int
    bytes_consumed: int
    def __init__(self, records_consumed: _Optional[int] = ..., bytes_read: _Optional[int] = ..., batches: _Optional[int] = ..., loop_seconds: _Optional[float] = ..., loop_wait_seconds: _Optional[float] = ..., reader_wait_seconds: _Optional[float] = ..., shm_in_use_bytes: _Optional[int] = ..., shm_budget_bytes: _Optional[int] = ..., pss_bytes: _Optional[_Mapping[str, int]] = ..., readers: _Optional[int] = ..., records_skipped: _Optional[int] = ..., bytes_consumed: _Optional[int] = ...) -> None: ...

class RecordRange(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class HandBack(_message.Message):
    __slots__ = ("lease_id", "consumed")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    consumed: _containers.RepeatedCompositeFieldContainer[RecordRange]
    def __init__(self, lease_id: _Optional[int] = ..., consumed: _Optional[_Iterable[_Union[RecordRange, _Mapping]]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("consumer", "consumed")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    consumed: _containers.RepeatedCompositeFieldContainer[HandBack]
    def __init__(self, consumer: _Optional[str] = ..., consumed: _Optional[_Iterable[_Union[HandBack, _Mapping]]] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("consumer", "consumed")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    consumed: _containers.RepeatedCompositeFieldContainer[HandBack]
    def __init__(self, consumer: _Optional[str] = ..., consumed: _Optional[_Iterable[_Union[HandBack, _Mapping]]] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("consumer", "max_tasks", "request_id")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    max_tasks: int
    request_id: int
    def __init__(self, consumer: _Optional[str] = ..., max_tasks: _Optional[int] = ..., request_id: _Optional[int] = ...) -> None: ...

class TaskLease(_message.Message):
    __slots__ = ("lease_id", "task_id", "epoch", "seq", "path", "start", "stop", "attempt", "deadline", "consumed")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    task_id: int
    epoch: int
    seq: int
    path: str
    start: int
    stop: int
    attempt: int
    deadline: float
    consumed: _containers.RepeatedCompositeFieldContainer[RecordRange]
    def __init__(self, lease_id: _Optional[int] = ..., task_id: _Optional[int] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., path: _Optional[str] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., attempt: _Optional[int] = ..., deadline: _Optional[float] = ..., consumed: _Optional[_Iterable[_Union[RecordRange, _Mapping]]] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("leases", "finished")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[TaskLease]
    finished: bool
    def __init__(self, leases: _Optional[_Iterable[_Union[TaskLease, _Mapping]]] = ..., finished: _Optional[bool] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LeaseProblem(_message.Message):
    __slots__ = ("lease_id", "error", "handed_to", "handed_as")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HANDED_TO_FIELD_NUMBER: _ClassVar[int]
    HANDED_AS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    error: str
    handed_to: str
    handed_as: int
    def __init__(self, lease_id: _Optional[int] = ..., error: _Optional[str] = ..., handed_to: _Optional[str] = ..., handed_as: _Optional[int] = ...) -> None: ...

class RenewReply(_message.Message):
    __slots__ = ("deadlines", "not_active")
    class DeadlinesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    DEADLINES_FIELD_NUMBER: _ClassVar[int]
    NOT_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    deadlines: _containers.ScalarMap[int, float]
    not_active: _containers.RepeatedCompositeFieldContainer[LeaseProblem]
    def __init__(self, deadlines: _Optional[_Mapping[int, float]] = ..., not_active: _Optional[_Iterable[_Union[LeaseProblem, _Mapping]]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class CompleteManyRequest(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CompleteManyReply(_message.Message):
    __slots__ = ("not_completed",)
    NOT_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    not_completed: _containers.RepeatedCompositeFieldContainer[LeaseProblem]
    def __init__(self, not_completed: _Optional[_Iterable[_Union[LeaseProblem, _Mapping]]] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("lease_id", "error", "permanent")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    error: str
    permanent: bool
    def __init__(self, lease_id: _Optional[int] = ..., error: _Optional[str] = ..., permanent: _Optional[bool] = ...) -> None: ...

class EpochInfoRequest(_message.Message):
    __slots__ = ("consumer", "epoch")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    epoch: int
    def __init__(self, consumer: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class EpochInfoReply(_message.Message):
    __slots__ = ("epoch", "num_tasks", "num_records", "left_records")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LEFT_RECORDS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_tasks: int
    num_records: int
    left_records: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., num_tasks: _Optional[int] = ..., num_records: _Optional[int] = ..., left_records: _Optional[_Iterable[int]] = ...) -> None: ...

class WhereaboutsRequest(_message.Message):
    __slots__ = ("consumer", "epoch", "seqs")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    epoch: int
    seqs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, consumer: _Optional[str] = ..., epoch: _Optional[int] = ..., seqs: _Optional[_Iterable[int]] = ...) -> None: ...

class TakenRequest(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TakenReply(_message.Message):
    __slots__ = ("not_taken",)
    NOT_TAKEN_FIELD_NUMBER: _ClassVar[int]
    not_taken: _containers.RepeatedCompositeFieldContainer[LeaseProblem]
    def __init__(self, not_taken: _Optional[_Iterable[_Union[LeaseProblem, _Mapping]]] = ...) -> None: ...

class WhereaboutsReply(_message.Message):
    __slots__ = ("whereabouts",)
    WHEREABOUTS_FIELD_NUMBER: _ClassVar[int]
    whereabouts: _containers.RepeatedScalarFieldContainer[Whereabouts]
    def __init__(self, whereabouts: _Optional[_Iterable[_Union[Whereabouts, str]]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "shard", "path", "start", "stop")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    shard: int
    path: str
    start: int
    stop: int
    def __init__(self, task_id: _Optional[int] = ..., shard: _Optional[int] = ..., path: _Optional[str] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class QuarantinedTask(_message.Message):
    __slots__ = ("epoch", "unit", "task", "error")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    unit: int
    task: Task
    error: str
    def __init__(self, epoch: _Optional[int] = ..., unit: _Optional[int] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class EpochProgress(_message.Message):
    __slots__ = ("epoch", "total_records", "todo_records", "leased_records", "done_records", "quarantined_records", "dropped_records", "total_units", "todo_units", "leased_units", "done_units", "quarantined_units", "finished", "quarantined", "dropped")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RECORDS_FIELD_NUMBER: _ClassVar[int]
    TODO_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LEASED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    DONE_RECORDS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_UNITS_FIELD_NUMBER: _ClassVar[int]
    TODO_UNITS_FIELD_NUMBER: _ClassVar[int]
    LEASED_UNITS_FIELD_NUMBER: _ClassVar[int]
    DONE_UNITS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_UNITS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    total_records: int
    todo_records: int
    leased_records: int
    done_records: int
    quarantined_records: int
    dropped_records: int
    total_units: int
    todo_units: int
    leased_units: int
    done_units: int
    quarantined_units: int
    finished: bool
    quarantined: _containers.RepeatedCompositeFieldContainer[QuarantinedTask]
    dropped: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, epoch: _Optional[int] = ..., total_records: _Optional[int] = ..., todo_records: _Optional[int] = ..., leased_records: _Optional[int] = ..., done_records: _Optional[int] = ..., quarantined_records: _Optional[int] = ..., dropped_records: _Optional[int] = ..., total_units: _Optional[int] = ..., todo_units: _Optional[int] = ..., leased_units: _Optional[int] = ..., done_units: _Optional[int] = ..., quarantined_units: _Optional[int] = ..., finished: _Optional[bool] = ..., quarantined: _Optional[_Iterable[_Union[QuarantinedTask, _Mapping]]] = ..., dropped: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class ConsumerProgress(_message.Message):
    __slots__ = ("consumer", "rank", "last_seen", "leases", "leased_records")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LEASED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    rank: int
    last_seen: float
    leases: _containers.RepeatedScalarFieldContainer[int]
    leased_records: int
    def __init__(self, consumer: _Optional[str] = ..., rank: _Optional[int] = ..., last_seen: _Optional[float] = ..., leases: _Optional[_Iterable[int]] = ..., leased_records: _Optional[int] = ...) -> None: ...

class ProgressReply(_message.Message):
    __slots__ = ("epochs_planned", "epochs_started", "epochs_finished", "finished", "num_tasks", "total_records", "epochs", "consumers", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    EPOCHS_PLANNED_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_STARTED_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RECORDS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    epochs_planned: int
    epochs_started: int
    epochs_finished: int
    finished: bool
    num_tasks: int
    total_records: int
    epochs: _containers.RepeatedCompositeFieldContainer[EpochProgress]
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerProgress]
    counters: _containers.ScalarMap[str, int]
    def __init__(self, epochs_planned: _Optional[int] = ..., epochs_started: _Optional[int] = ..., epochs_finished: _Optional[int] = ..., finished: _Optional[bool] = ..., num_tasks: _Optional[int] = ..., total_records: _Optional[int] = ..., epochs: _Optional[_Iterable[_Union[EpochProgress, _Mapping]]] = ..., consumers: _Optional[_Iterable[_Union[ConsumerProgress, _Mapping]]] = ..., counters: _Optional[_Mapping[str, int]] = ...) -> None: ...
