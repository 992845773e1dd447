"""Run-time switches of ``monarch.actor``: assign to change them, in the process where
they should act (a proc reads its own copy; set it in a spawn's ``bootstrap`` function
to change it there). Guide: [Logging](../logging.md)."""

#: Prefix the ``logging`` records made inside an actor with ``[actor=<qualified name>] ``.
prefix_python_logs_with_actor: bool = True

__all__ = ["prefix_python_logs_with_actor"]
