"""The error a verb of the ``monarch`` command ends with."""

from __future__ import annotations

__all__ = ["USAGE", "CliError"]

#: The exit status of a command line that is wrong (argparse's own status for one).
USAGE = 2


class CliError(Exception):
    """Ends the verb: the message (what happened and what to do) goes to stderr after
    ``monarch <verb>:``, and the command exits with ``status`` (1, or :data:`USAGE` for
    arguments that are wrong)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
