"""Ping-pong: two actors on two procs exchange messages.

Run it with ``python examples/ping_pong.py [ROUNDS]`` (``make demo`` does). One actor mesh
is passed to the other as an argument: meshes pickle as references, so the receiving
actor can call the actors behind it directly, proc to proc.
"""

import sys
import time

from monarch.actor import Actor, context, endpoint, this_host


class Player(Actor):
    @endpoint
    def ping(self, n: int) -> int:
        """Answer a ping: the pong is the same number back."""
        return n

    @endpoint
    def play(self, partner: "Player", rounds: int) -> float:
        """Ping ``partner`` ``rounds`` times, one at a time; the mean round trip in s."""
        me = context().actor_instance.rank["procs"]  # my place in the proc mesh
        print(f"player {me}: playing {rounds} rounds")
        start = time.perf_counter()
        for n in range(rounds):
            assert partner.ping.call_one(n).get() == n
        return (time.perf_counter() - start) / rounds


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1000

procs = this_host().spawn_procs({"procs": 2})  # two OS processes
players = procs.spawn("players", Player)  # one Player on each
players.initialized.get()  # both ran __init__: safe to hand them to each other

ping, pong = players.slice(procs=0), players.slice(procs=1)
rtt = ping.play.call_one(pong, rounds).get()  # ping calls pong `rounds` times
print(f"ping -> pong: {rounds} round trips, {rtt * 1e6:.1f} us each")
rtt = pong.play.call_one(ping, rounds).get()  # and back the other way
print(f"pong -> ping: {rounds} round trips, {rtt * 1e6:.1f} us each")
# The procs, and the players on them, stop when this script exits.
