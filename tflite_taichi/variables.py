"""State kept across invokes, wherever its newest value lives: the interpreter's resource
variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE), and each subgraph's variable tensors
(an LSTM's h and c, as float views), one `Variables` store each.

A variable's value is an array in the model's dtype (an int8 state holds its integer codes, as
LiteRT stores it). The host keeps one; a delegated partition that assigns the variable keeps
the newer value in a slot of its program's io buffer, on the device, so that a streaming model
(a wake-word detector's ring buffers) runs as one partition per invoke with its state never
crossing to the host. The host asks for the value only when something on the host reads it: a
READ_VARIABLE on the CPU, another program, or the interpreter's close.

Every write bumps the variable's version, so a program knows whether its slot is current
(`version`) without comparing data.
"""
from __future__ import annotations

from typing import Any, Optional


class Variables:
    """resource handle -> value, with the device copies that are newer than the host's.

    The reference path (ops/state.py) uses it as a dict: `get(handle)`, `store[handle] = value`.
    A program holding a newer value is asked for it with `program.take_variable(handle)`."""

    def __init__(self):
        self._host: dict = {}           # handle -> array in the model's dtype
        self._holder: dict = {}         # handle -> program whose slot is newer than _host
        self._version: dict = {}        # handle -> writes so far

    def get(self, handle, default=None) -> Any:
        """The current value (fetched from the device when a program holds a newer one)."""
        holder = self._holder.pop(handle, None)
        if holder is not None:
            self._host[handle] = holder.take_variable(handle)
        return self._host.get(handle, default)

    def __getitem__(self, handle):
        value = self.get(handle)
        if value is None:
            raise KeyError(handle)
        return value

    def __setitem__(self, handle, value) -> None:
        """A write on the host: the device copies are stale from now on."""
        self._host[handle] = value
        self._holder.pop(handle, None)
        self._version[handle] = self._version.get(handle, 0) + 1

    def __contains__(self, handle) -> bool:
        return handle in self._host or handle in self._holder

    def __len__(self) -> int:
        return len(set(self._host) | set(self._holder))

    def snapshot(self, exclude=()) -> dict:
        """Every current value (fetched where a program holds a newer one), but `exclude`'s."""
        return {k: self.get(k) for k in list(self._host) + list(self._holder)
                if k not in exclude}

    def version(self, handle) -> int:
        return self._version.get(handle, 0)

    def holder(self, handle) -> Optional[Any]:
        return self._holder.get(handle)

    def written_on_device(self, handle, program) -> int:
        """`program`'s slot now holds the newest value (a delegated ASSIGN_VARIABLE ran, or is
        enqueued); returns the new version."""
        self._holder[handle] = program
        self._version[handle] = self._version.get(handle, 0) + 1
        return self._version[handle]

    def release(self, program) -> None:
        """`program` is closing: the values only its slots hold come to the host first."""
        for handle in [h for h, p in self._holder.items() if p is program]:
            self.get(handle)
