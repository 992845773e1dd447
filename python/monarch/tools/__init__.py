"""Command-line tools: ``monarch`` (see :mod:`monarch.tools.cli`)."""
