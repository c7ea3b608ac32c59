"""User-facing error type: one line naming the file/field and the fix; the CLI maps it to exit code 2."""

from __future__ import annotations


class KvplanInputError(ValueError):
    """Bad user input (scenario, trace, profile, grid).

    The message is a single line that names where the problem is (file, line, field) and how to fix it.
    The CLI prints ``error: <message>`` and exits with status 2, never a traceback.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def input_error(where: str, problem: str, fix: str | None = None) -> KvplanInputError:
    """Build a :class:`KvplanInputError` as ``<where>: <problem>[; <fix>]``."""
    msg = f"{where}: {problem}"
    if fix:
        msg += f"; {fix}"
    return KvplanInputError(msg)
