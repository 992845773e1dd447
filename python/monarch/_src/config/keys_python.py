"""The config keys of the section "Python actors and the runtime" of docs/config.md: tokio
worker threads, event loops and dispatch.

The registry (:mod:`monarch._src.config.keys`) lists them in this order.
"""

from __future__ import annotations

from monarch._src.config.keys_base import POSITIVE, Key, in_group
from monarch._src.config.kinds import BOOL, DURATION, US, optional

#: The docs section these keys are listed in.
GROUP = "Python actors and the runtime"

#: The keys of the section, in docs order.
KEYS: list[Key] = [
    *in_group(
        GROUP,
        Key(
            "tokio_worker_threads",
            "MONARCH_TOKIO_WORKER_THREADS",
            optional(POSITIVE),
            None,
            "The number of worker threads of a process's tokio runtime (None: the "
            "implementation's choice).",
            effect="Read from the environment variable only, when a process starts its "
            "runtime: its number of tokio worker threads (unset: 2 in the client, 1 in "
            "spawned procs). configure() cannot change a runtime that has started.",
        ),
        Key(
            "shared_asyncio_runtime",
            "HYPERACTOR_SHARED_ASYNCIO_RUNTIME",
            BOOL,
            False,
            "Run all Python actors of a process on one asyncio event loop.",
            ignored="Each Python actor here has its own thread, and an async actor its own "
            "asyncio loop on it, which keeps one actor's blocking code from stalling the others.",
        ),
        Key(
            "actor_queue_dispatch",
            "MONARCH_ACTOR_QUEUE_DISPATCH",
            BOOL,
            False,
            "Dispatch messages to Python actors through a queue.",
            ignored="Messages always reach Python actors here through the actor's own ordered "
            "queue, read by its thread.",
        ),
        Key(
            "call_spin",
            "MONARCH_CALL_SPIN",
            DURATION,
            200 * US,
            "The longest a thread waiting for a call's replies, or an actor's thread waiting "
            "for its next message, spins before it sleeps (0: never).",
            effect="A thread blocked in a call's get() (call_one, call and their kin), and an "
            "actor's own thread waiting for its next message, first watch for what they "
            "wait for, yielding the core between looks, for up to twice the average of "
            "their recent waits and at most this long; then they sleep. What comes within "
            "that time skips the wake-up of a sleeping thread: a call_one to an actor on "
            "the same host takes about half as long. A thread whose recent waits took "
            "longer than this sleeps at once, so long calls and idle actors spend nothing "
            "on it. 0 turns it off (for instance where every core is busy with other "
            "work). Read when a process starts its runtime, and passed to the procs it "
            "spawns.",
        ),
    ),
]
