"""What the supervisor hands a worker at its start, on the worker's stdin.

Pickled: the settings exactly as the supervisor validated them, secrets included (a SecretStr pickles
its value), through a pipe only the two processes hold, so that no secret is put on a command line or
into an environment (`ps`, `/proc/<pid>/environ`). Pickle runs what it reads, which is safe here only
because the bytes come from the process that started this one.

The pipe stays open afterwards, as the worker's lifeline: its end (the supervisor gone, even killed)
stops the worker (`worker.py`).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import BinaryIO

from llamafleet_router.settings import RouterSettings


@dataclass(frozen=True)
class WorkerSpec:
    #: The worker's number, 0..N-1: its `worker` label in the merged metrics and its logs' field.
    index: int
    #: The supervisor's settings, with `port` resolved (port 0 becomes the port the supervisor holds).
    settings: RouterSettings
    #: The inherited file descriptor of the worker's private metrics socket (loopback, bound).
    metrics_fd: int


def encode(spec: WorkerSpec) -> bytes:
    return pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)


def read_spec(stream: BinaryIO) -> WorkerSpec:
    spec = pickle.load(stream)
    if not isinstance(spec, WorkerSpec):
        raise TypeError(f"expected a WorkerSpec on stdin, got {type(spec).__name__}")
    return spec
