"""``LocalJob``: a job whose every mesh is this machine (``this_host()``)."""

from __future__ import annotations

from collections.abc import Sequence

from monarch._src.job.trait import JobState, JobTrait, _refuse_batch

__all__ = ["LocalJob"]


class LocalJob(JobTrait):
    """Every named mesh is this machine: ``this_host()``, a 0-dimensional host mesh
    (no ``"hosts"`` dimension). Lets a program written against a job run locally by
    swapping the job. Nothing is started or killed; a cached ``LocalJob`` is never
    reused (a fresh one is as good)."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        if isinstance(hosts, str) or not all(isinstance(h, str) and h for h in hosts):
            raise TypeError(
                f"LocalJob(hosts={hosts!r}): expected a sequence of mesh names, e.g. "
                "LocalJob(hosts=('trainers', 'dataloaders'))"
            )
        super().__init__()
        self._host_names: tuple[str, ...] = tuple(hosts)

    def _create(self, client_script: str | None) -> None:
        _refuse_batch(self, client_script)

    def _state(self) -> JobState:
        from monarch._src.actor.proc_mesh import this_host

        host = this_host()
        return JobState({name: host for name in self._host_names})

    def can_run(self, spec: JobTrait) -> bool:
        """Never: a ``LocalJob`` has no allocation to reuse (``state()`` is always this
        machine, so there is nothing to save between programs).

        Args:
            spec: The job specification a new program asks for.

        Returns:
            ``False``.
        """
        return False

    def _kill(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LocalJob(hosts={self._host_names!r})"
