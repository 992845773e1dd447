"""Fixtures of the actor tests.

For the whole session ``monarch.actor.unhandled_fault_hook`` is a recorder (the default
hook would stop the test run, as it stops a program); a test that provokes failures
asserts on what reached the client through the ``faults`` fixture.
"""

from __future__ import annotations

from fault_recorder import Faults, _record_faults, faults

__all__ = ["Faults", "_record_faults", "faults"]
