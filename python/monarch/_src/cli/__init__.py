"""The ``monarch`` command (``monarch.tools.cli`` re-exports its entry points).

``parser`` holds the command table: each verb declared once (name, help, arguments,
handler), the parser built from it, and ``main``. The handlers import what their verb
needs: ``jobs`` applies, inspects and kills the current job and manages contexts (the
``.monarch/`` layout is :mod:`monarch._src.job.context`); ``commands`` runs commands and
shells on the job's hosts (:func:`monarch.job.exec_command`, :func:`monarch.job.shell`);
``probe`` checks that hosts answer; ``options`` parses the ``K=V`` and ``dim=N``
arguments; ``monarch top`` is :mod:`monarch._src.monitoring.tui`.

Only ``parser``, ``options``, ``errors`` and the terminal UI's argument declarations are
imported to parse a command line: the actor runtime is imported once a verb needs it, so
``monarch --help`` stays fast.
"""
