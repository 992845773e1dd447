"""Debugging actors with pdb: a rank computes a wrong value, and ``breakpoint()`` pauses
that rank so you can look at it from ``monarch debug``.

Four ``Scorer`` actors each score their own shard of a data set: the weighted mean of
their values. One shard's weights add up to zero (its samples were all down-weighted to
nothing), so that rank's mean comes out as ``nan`` while the others are fine. The
endpoint stops at ``breakpoint()`` only when its result is not finite, the usual way of
catching the one rank (out of many) that goes wrong: the other ranks return (the
client prints their scores as they come in) and the client waits for the paused one.

Run it, and the script's stderr names the paused rank and the command to attach (in
one line):

    $ python examples/debugging.py
    monarch: actor 'scorers' rank 2 is paused at a breakpoint in score (...); to debug
    it, run: monarch debug --port 27000

In another terminal on the same machine, attach to the paused rank and inspect it:

    $ monarch debug
    monarch_dbg> attach scorers 2
    (Pdb) p total_weight
    0.0
    (Pdb) p self.weights
    [0.0, 0.0, 0.0]
    (Pdb) c
    monarch_dbg> quit

When pdb continues, the endpoint returns its ``nan``, and the script prints that
rank's score and the list of ranks that failed. ``docs/debugging.md`` is the
debugger's guide.
Set ``MONARCH_DEBUG_ATTACH_TIMEOUT=5`` in the environment to run the script unattended:
the breakpoint then gives up waiting after 5 seconds.
"""

from __future__ import annotations

import math

from monarch.actor import Actor, current_rank, endpoint, this_host

#: Each rank's shard: (value, weight) pairs. Rank 2's weights add up to zero.
SHARDS = [
    [(1.0, 1.0), (2.0, 1.0), (3.0, 2.0)],
    [(4.0, 0.5), (5.0, 0.5), (6.0, 1.0)],
    [(7.0, 0.0), (8.0, 0.0), (9.0, 0.0)],
    [(10.0, 1.0), (11.0, 1.0), (12.0, 1.0)],
]
#: How long the client waits for the scores, in seconds (long enough to debug).
TIMEOUT_S = 600.0


class Scorer(Actor):
    def __init__(self) -> None:
        self.rank = current_rank()["ranks"]
        self.values = [value for value, _ in SHARDS[self.rank]]
        self.weights = [weight for _, weight in SHARDS[self.rank]]

    @endpoint
    def score(self) -> tuple[int, float]:
        """This rank, and the weighted mean of its values."""
        total_weight = sum(self.weights)
        weighted = sum(v * w for v, w in zip(self.values, self.weights, strict=True))
        mean = weighted / total_weight if total_weight else math.nan
        if not math.isfinite(mean):
            breakpoint()  # only the rank that went wrong stops here
        return self.rank, mean


def main() -> None:
    procs = this_host().spawn_procs(per_host={"ranks": len(SHARDS)})
    scorers = procs.spawn("scorers", Scorer)
    # Print the scores as they come: the healthy ranks' first, the paused one's last.
    bad = []
    for future in scorers.score.stream():
        rank, score = future.get(timeout=TIMEOUT_S)
        print(f"rank {rank}: score {score:.3f}", flush=True)
        if not math.isfinite(score):
            bad.append(rank)
    print(f"ranks with a bad score: {bad}")
    procs.stop().get(timeout=60)


if __name__ == "__main__":
    main()
