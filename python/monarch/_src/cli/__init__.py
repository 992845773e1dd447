"""The job verbs of the ``monarch`` command: ``apply``, ``exec``, ``shell``, ``kill``,
``context`` and ``status`` (``worker`` and ``debug`` live in ``monarch.tools.cli``).

``parser`` declares the verbs and their help; ``jobs`` applies, inspects and kills the
current job and manages contexts (the ``.monarch/`` layout is
:mod:`monarch._src.job.context`); ``commands`` runs commands and shells on the job's
hosts (:func:`monarch.job.exec_command`, :func:`monarch.job.shell`); ``probe`` checks
that hosts answer; ``options`` parses the ``K=V`` and ``dim=N`` arguments.

Only ``parser``, ``options`` and ``errors`` are imported to parse a command line: the
actor runtime is imported once a verb needs it, so ``monarch --help`` stays fast.
"""
