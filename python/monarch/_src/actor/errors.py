"""The errors a caller sees: ``ActorError`` (an endpoint raised; the actor lives on)
and ``SupervisionError`` (the actor failed, was stopped, or its proc is gone)."""

from __future__ import annotations

from typing import Any

from monarch._src.actor.pickling import dumps, format_exception, loads


class ActorError(Exception):
    """An exception raised inside a remote endpoint; the actor lives on.

    ``exception`` is the original exception object (or a ``RuntimeError`` describing it
    when it could not be pickled), ``exception_formatted`` its remote traceback and
    ``message`` which call failed (``"Actor call trainers.step failed."``).
    """

    def __init__(
        self,
        exception: BaseException,
        message: str = "A remote actor call has failed.",
        exception_formatted: str | None = None,
    ) -> None:
        self.exception = exception
        self.message = message
        self.exception_formatted = (
            exception_formatted if exception_formatted is not None else format_exception(exception)
        )
        super().__init__(message)

    def __str__(self) -> str:
        return (
            f"{self.message}\n Traceback of where the remote call failed (most recent call "
            f"last):\n{self.exception_formatted}"
        )

    @classmethod
    def _of_call(
        cls, exception: BaseException, actor: str, method: str, where: str = ""
    ) -> ActorError:
        """The error of a call to ``actor.method`` (``where``: when it failed, if not
        while the method ran)."""
        return cls(exception, f"Actor call {actor}.{method} failed{where}.")

    def _to_wire(self) -> tuple[Any, str, str, str]:
        try:
            exc_blob: Any = dumps(self.exception)
            loads(exc_blob)
        except Exception:
            exc_blob = None
        return (exc_blob, repr(self.exception), self.exception_formatted, self.message)

    @classmethod
    def _from_wire(cls, wire: tuple[Any, str, str, str]) -> ActorError:
        exc_blob, exc_repr, formatted, message = wire
        exception: BaseException
        try:
            exception = loads(exc_blob) if exc_blob is not None else RuntimeError(exc_repr)
        except Exception:
            exception = RuntimeError(exc_repr)
        return cls(exception, message, formatted)


class SupervisionError(RuntimeError):
    """A call reached an actor that has failed or was stopped (or could not be
    reached). ``endpoint`` names the endpoint called, when known."""

    def __init__(self, message: str, endpoint: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint


class MessageTooLargeError(SupervisionError, ValueError):
    """A message was over the largest message a channel carries (the
    ``codec_max_frame_length`` config key), so it was not sent: the call it carried
    cannot reach its actors. A ``SupervisionError`` (as upstream Monarch reports an
    undeliverable message) and a ``ValueError`` (the argument is too large)."""
