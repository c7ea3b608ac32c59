"""How kvplan's warnings reach the terminal during one command: each distinct message once.

kvplan's modules warn through :mod:`logging` (``kvplan.<module>`` loggers, no handler of their own, so Python's
last-resort handler printed every record). A command that simulates the same input many times (``compare``'s
policies, ``recommend``'s TTL grid, ``capacity``'s sizes) met the same warning in every run: ``compare --trace``
printed "select: 574 request(s) over 40960 tokens were skipped" once per policy. :func:`warnings_once` gives the
``kvplan`` logger, for one command, a handler that prints a record's message as the last-resort handler did
(the bare message on the current ``sys.stderr``) unless the same logger already printed the same message in this
command. Records still propagate (a test's ``caplog`` sees all of them); worker processes of a sweep keep
Python's default.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: The parent of every kvplan module's logger.
LOGGER = "kvplan"


class _OncePerCommand(logging.Handler):
    """Writes a WARNING-or-above record's message to the current ``sys.stderr``, each (logger, message) once."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: set[tuple[str, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            key = (record.name, msg)
            if key in self.seen:
                return
            self.seen.add(key)
            stream = sys.stderr
            stream.write(msg + "\n")
            stream.flush()
        except Exception:  # a closed or broken stderr: logging's own policy (report, never raise)
            self.handleError(record)


@contextmanager
def warnings_once() -> Iterator[None]:
    """For the duration of one command: kvplan's warnings printed once each (see the module docstring)."""
    logger = logging.getLogger(LOGGER)
    handler = _OncePerCommand()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
