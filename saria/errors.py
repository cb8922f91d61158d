"""Error types shared by the parts of saria.

Every error a user can cause is one line that names what is wrong and where:
the file and line for traces, the key for configuration.
"""

from __future__ import annotations


class SariaError(Exception):
    """Base class of the errors saria raises on bad input."""


class TraceFormatError(SariaError, ValueError):
    """A trace file is malformed; the message names the file and line."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # from a worker process to its parent intact
        return type(self), (self.path, self.line, self.message)


class ConfigError(SariaError, ValueError):
    """A configuration value is invalid; the message names the key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")

    def __reduce__(self):  # from a worker process to its parent intact
        return type(self), (self.key, self.message)
