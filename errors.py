"""User-facing error type: one line naming the file/field and the fix; the CLI maps it to exit code 2."""

from __future__ import annotations


class KvplanInputError(ValueError):
    """Bad user input (scenario, trace, profile, grid).

    The message is a single line that names where the problem is (file, line, field) and how to fix it.
    The CLI prints ``error: <message>`` and exits with status 2, never a traceback.
    """

    def __init__(self, message: str) -> None:
        super().__init__(clip_message(" ".join(str(message).split())))


#: Longest error line printed; a longer one (a value echoed back: a 4 MiB YAML string as a model name, a 100 kB
#: command-line argument) keeps its head (where, problem) and tail (the fix) around a count of what was left out.
MAX_MESSAGE_CHARS = 2000
_HEAD_CHARS, _TAIL_CHARS = 1200, 600


def clip_message(message: str) -> str:
    """``message`` if it fits :data:`MAX_MESSAGE_CHARS`, else its first and last characters around
    ``[... N characters ...]``."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    cut = len(message) - _HEAD_CHARS - _TAIL_CHARS
    return f"{message[:_HEAD_CHARS]} [... {cut:,} characters ...] {message[-_TAIL_CHARS:]}"


def input_error(where: str, problem: str, fix: str | None = None) -> KvplanInputError:
    """Build a :class:`KvplanInputError` as ``<where>: <problem>[; <fix>]``."""
    msg = f"{where}: {problem}"
    if fix:
        msg += f"; {fix}"
    return KvplanInputError(msg)
