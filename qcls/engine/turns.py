"""Turns on a device that a configuration is built on while another one serves (a reload in a replica).

CUDA graph capture, device-wide synchronization and cache releases beside live forwards from other threads of
the same process can deadlock a replica (measured on H200s: the build's thread in the capture's device
synchronize, the serving collector in its batch's event, neither returning). A build therefore uses the device in
turns: it holds the device (no serving batch in flight, none launched) and gives way between its steps (a
prompt's prefix fill, a bucket, a bucket's warm-up, a graph capture, a warm-up request), when the queries and
jobs that waited meanwhile run. A build with nothing beside it (start-up, a Classifier in a script) takes no
turns: `ALONE`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol


class DeviceTurns(Protocol):
    def hold_device(self) -> None:
        """Return once no other work is on the device; none starts until `release_device`."""

    def give_way(self) -> None:
        """Between two steps of a held turn: let the work that waits run, then hold the device again."""

    def release_device(self) -> None:
        """End the turn: the others use the device again."""


class _Alone:
    def hold_device(self) -> None:
        pass

    def give_way(self) -> None:
        pass

    def release_device(self) -> None:
        pass


ALONE: DeviceTurns = _Alone()


@contextmanager
def holding(turns: DeviceTurns) -> Iterator[DeviceTurns]:
    """The device held for the block, released however it ends."""
    turns.hold_device()
    try:
        yield turns
    finally:
        turns.release_device()
