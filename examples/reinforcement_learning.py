"""Reinforcement learning with actors: generators collect experience with the current
policy, a learner improves the policy, and the weights go from the learner to the
generators over ``monarch.rdma``.

The task is a toy *contextual bandit*: each episode shows a context, a vector of
``FEATURES`` numbers, and the agent pulls one of ``ARMS`` arms; the arm that pays (reward
1, the others 0) depends on the context through a hidden rule. The policy is tiny: one
``torch.nn.Linear`` layer and a softmax over the arms.

- ``Learner`` (one actor) owns the policy. It keeps a flat copy of its weights, plus a
  version number, in one tensor registered as an ``RDMABuffer``, and hands out the
  buffer's handle once. Each round it takes the generators' episodes, does one policy
  gradient step (REINFORCE with the mean reward as baseline) and rewrites the flat
  tensor in place.
- ``Generator`` (a mesh of ``--generators`` actors, one per proc) reads the weights
  one-sided each round, straight from the learner's memory into its own
  (``await buffer.read_into(...)``: the learner's endpoints are not involved), checks
  their version, and plays ``--episodes`` episodes with them.

The client runs the rounds: ``generators.rollout.call(round)`` gathers every
generator's episodes (a ``ValueMesh``), ``learner.update.call_one(...)`` learns from
them. The average reward climbs from about ``1/ARMS`` (a random policy) to near 1;
the script prints it as it goes, and the average of the first and last rounds.

Run it with ``python examples/reinforcement_learning.py`` (2 generators, 25 rounds; a
few seconds, on CPU). The RDMA guide is ``docs/rdma.md``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import nn

from monarch.actor import Actor, current_rank, endpoint, this_host
from monarch.rdma import RDMABuffer

#: The size of a context and the number of arms.
FEATURES, ARMS = 4, 4
#: How long the client waits for any one call, in seconds.
TIMEOUT_S = 60.0


def make_policy() -> nn.Linear:
    """Logits of the arms from a context; the softmax of them is the policy."""
    torch.manual_seed(0)
    policy = nn.Linear(FEATURES, ARMS)
    nn.init.zeros_(policy.weight)  # start uniform: every arm equally likely
    nn.init.zeros_(policy.bias)
    return policy


def num_params(policy: nn.Module) -> int:
    return sum(p.numel() for p in policy.parameters())


#: The hidden rule: the arm that pays for context ``x`` is ``argmax(RULE @ x)``.
RULE = torch.tensor(
    [[1.0, 0.0, 0.5, -1.0], [-1.0, 1.0, 0.0, 0.5], [0.0, -1.0, 1.0, 0.0], [0.5, 0.5, -1.0, 1.0]]
)


@dataclass
class Episodes:
    """One generator's experience of a round."""

    contexts: torch.Tensor  # (n, FEATURES)
    actions: torch.Tensor  # (n,), the arms pulled
    rewards: torch.Tensor  # (n,)
    version: int  # the version of the weights that played them


class Learner(Actor):
    def __init__(self, lr: float) -> None:
        self.policy = make_policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=lr)
        self.version = 0
        # The weights as one flat float32 tensor, and the version in the last element:
        # what generators read. Registered once; rewritten in place after each step.
        self.flat = torch.zeros(num_params(self.policy) + 1)
        self.publish()
        self.buffer = RDMABuffer(self.flat.view(torch.uint8))

    def publish(self) -> None:
        with torch.no_grad():
            self.flat[:-1] = nn.utils.parameters_to_vector(self.policy.parameters())
            self.flat[-1] = self.version

    @endpoint
    def weights_handle(self) -> RDMABuffer:
        """The handle of the weights' memory (a small reference, not the weights)."""
        return self.buffer

    @endpoint
    def update(self, batches: list[Episodes]) -> float:
        """One policy gradient step from the generators' episodes; the mean reward."""
        assert all(b.version == self.version for b in batches), "stale episodes"
        contexts = torch.cat([b.contexts for b in batches])
        actions = torch.cat([b.actions for b in batches])
        rewards = torch.cat([b.rewards for b in batches])
        log_probs = torch.log_softmax(self.policy(contexts), dim=1)
        chosen = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)
        advantage = rewards - rewards.mean()
        loss = -(advantage * chosen).mean()
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.version += 1
        self.publish()  # generators read it at their next round
        return float(rewards.mean())


class Generator(Actor):
    def __init__(self, episodes: int) -> None:
        self.rank = current_rank()["generators"]
        self.episodes = episodes
        self.policy = make_policy()
        self.flat = torch.zeros(num_params(self.policy) + 1)
        self.weights: RDMABuffer | None = None

    @endpoint
    async def connect(self, learner: Learner) -> str:
        """Get the learner's weights handle (once); the RDMA backend in use."""
        self.weights = await learner.weights_handle.call_one()
        return self.weights.backend

    @endpoint
    async def rollout(self, round: int) -> Episodes:
        """Read the current weights one-sided, then play this round's episodes."""
        assert self.weights is not None, "connect first"
        await self.weights.read_into(self.flat.view(torch.uint8))
        version = int(self.flat[-1])
        assert version == round, f"read weights version {version}, expected {round}"
        with torch.no_grad():
            nn.utils.vector_to_parameters(self.flat[:-1], self.policy.parameters())
            gen = torch.Generator().manual_seed(1000 * round + self.rank)
            contexts = torch.randn(self.episodes, FEATURES, generator=gen)
            probs = torch.softmax(self.policy(contexts), dim=1)
            actions = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            best = (contexts @ RULE.T).argmax(dim=1)
            rewards = (actions == best).float()
        return Episodes(contexts, actions, rewards, version)


def train(num_generators: int, rounds: int, episodes: int, lr: float) -> list[float]:
    """Train for ``rounds`` rounds; the mean reward of each."""
    learner_procs = this_host().spawn_procs(per_host={"procs": 1})
    generator_procs = this_host().spawn_procs(per_host={"generators": num_generators})
    try:
        learner = learner_procs.spawn("learner", Learner, lr)
        generators = generator_procs.spawn("generators", Generator, episodes)
        backends = set(generators.connect.call(learner).get(timeout=TIMEOUT_S).values())
        print(f"{num_generators} generators read the learner's weights over {backends}")
        rewards = []
        for round in range(rounds):
            batches = generators.rollout.call(round).get(timeout=TIMEOUT_S).values()
            rewards.append(learner.update.call_one(batches).get(timeout=TIMEOUT_S))
            if round % 5 == 0 or round == rounds - 1:
                print(f"round {round:3d}: average reward {rewards[-1]:.3f}", flush=True)
        return rewards
    finally:
        generator_procs.stop().get(timeout=TIMEOUT_S)
        learner_procs.stop().get(timeout=TIMEOUT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--episodes", type=int, default=128, help="per generator and round")
    parser.add_argument("--lr", type=float, default=0.2)
    args = parser.parse_args()
    rewards = train(args.generators, args.rounds, args.episodes, args.lr)
    k = max(1, len(rewards) // 5)
    start, end = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    print(f"average reward: first {k} rounds {start:.3f}, last {k} rounds {end:.3f}")
    assert end > start + 0.3, "the policy did not improve"
    print("the policy improved")


if __name__ == "__main__":
    main()
