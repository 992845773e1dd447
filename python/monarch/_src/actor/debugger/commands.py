"""The commands of the ``monarch_dbg>`` prompt, parsed.

>>> parse("attach trainer 3")
Attach(actor='trainer', rank=3)
>>> parse("a 1")
Attach(actor=None, rank=1)
>>> cast = parse("cast trainer ranks(0, 2:4) p loss")
>>> cast.actor, cast.command, [r for r in range(6) if cast.ranks.matches(r, {})]
('trainer', 'p loss', [0, 2, 3])
>>> parse("cast trainer gpus=1 n").ranks.matches(5, {"hosts": 2, "gpus": 1})
True
>>> parse("l"), parse("continue"), parse("q")
(List(), Continue(), Quit())
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "HELP",
    "Attach",
    "Cast",
    "Command",
    "Continue",
    "Help",
    "List",
    "Quit",
    "Ranks",
    "parse",
]

HELP = """\
Commands of the monarch debugger:
  list | l                         the sessions: actors paused in pdb (breakpoint() or
                                   post-mortem), with where each is and whether it waits
  attach | a <actor> <rank>        drive that session's pdb: type pdb commands (l, p x,
                                   n, s, c, ...); `detach` comes back here
  cast <actor> <ranks> <command>   send one pdb command to several sessions at their
                                   prompt and show what each printed; <ranks> is one of
                                   3 | 0,2 | 0:4 | * | ranks(1,3) | ranks(gpus=0:2)
  continue | c                     send pdb `c` to every session at its prompt
  quit | q                         leave the debugger; sessions stay paused (run
                                   `monarch debug` again to come back)
  help | h                         this text
"""


class Ranks:
    """Which ranks a ``cast`` goes to: every rank, some linear ranks (numbers and
    ``start:stop[:step]`` ranges, ``stop`` excluded), or a coordinate per dimension
    (``gpus=0:2``; every given dimension must match)."""

    def __init__(
        self,
        every: bool = False,
        linear: list[range] | None = None,
        dims: dict[str, range] | None = None,
    ) -> None:
        self.every = every
        self.linear = linear or []
        self.dims = dims or {}

    def matches(self, rank: int, coords: dict[str, int]) -> bool:
        if self.every:
            return True
        if self.dims:
            return all(d in coords and coords[d] in r for d, r in self.dims.items())
        return any(rank in r for r in self.linear)

    def __repr__(self) -> str:
        if self.every:
            return "Ranks(*)"
        return f"Ranks({self.dims or self.linear})"


_MAX = 2**62


def _range(text: str, what: str) -> range:
    text = text.strip()
    try:
        if ":" not in text:
            n = int(text)
            if n < 0:
                raise ValueError
            return range(n, n + 1)
        parts = text.split(":")
        if len(parts) > 3:
            raise ValueError
        start = int(parts[0]) if parts[0].strip() else 0
        stop = int(parts[1]) if parts[1].strip() else _MAX
        step = int(parts[2]) if len(parts) == 3 and parts[2].strip() else 1
        if start < 0 or stop < 0 or step < 1:
            raise ValueError
        return range(start, stop, step)
    except ValueError:
        raise ValueError(
            f"{what} {text!r} is not a rank: give a number, or start:stop[:step] (stop excluded)"
        ) from None


def parse_ranks(text: str) -> Ranks:
    """``*``, ``all``, ``3``, ``0,2``, ``1:4``, ``ranks(...)`` of those, or
    ``gpus=0:2,hosts=1``."""
    text = text.strip()
    if text.startswith("ranks(") and text.endswith(")"):
        text = text[len("ranks(") : -1].strip()
    if text in ("*", "all"):
        return Ranks(every=True)
    if not text:
        raise ValueError("no ranks given: give e.g. 0, 0,2, 1:4, * or ranks(gpus=0:2)")
    items = [i.strip() for i in text.split(",")]
    if any("=" in i for i in items):
        dims: dict[str, range] = {}
        for item in items:
            if "=" not in item:
                raise ValueError(
                    f"ranks {text!r} mix a linear rank ({item!r}) and coordinates "
                    "(dim=value); use one or the other"
                )
            dim, value = (s.strip() for s in item.split("=", 1))
            if not dim.isidentifier():
                raise ValueError(f"{dim!r} in ranks {text!r} is not a dimension name")
            dims[dim] = _range(value, f"coordinate {dim}=")
        return Ranks(dims=dims)
    return Ranks(linear=[_range(i, "rank") for i in items])


@dataclass
class List:
    pass


@dataclass
class Attach:
    #: ``None``: the only actor name that has sessions.
    actor: str | None
    rank: int


@dataclass
class Cast:
    actor: str
    ranks: Ranks = field(repr=False)
    command: str


@dataclass
class Continue:
    pass


@dataclass
class Quit:
    pass


@dataclass
class Help:
    pass


Command = List | Attach | Cast | Continue | Quit | Help

_USAGE = {
    "attach": "usage: attach <actor> <rank> (see `list`)",
    "cast": "usage: cast <actor> <ranks> <pdb command>, e.g. cast trainer ranks(0,2) p loss",
}


def _rank(text: str) -> int:
    try:
        rank = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a rank; {_USAGE['attach']}") from None
    if rank < 0:
        raise ValueError(f"{text!r} is not a rank; {_USAGE['attach']}")
    return rank


def parse(line: str) -> Command | None:
    """The command of one line (``None`` for an empty line).

    Raises:
        ValueError: an unknown command or bad arguments, with the usage.
    """
    words = line.split(None, 1)
    if not words:
        return None
    verb = words[0]
    rest = words[1].strip() if len(words) > 1 else ""
    if verb in ("list", "l"):
        return List()
    if verb in ("continue", "c"):
        return Continue()
    if verb in ("quit", "q", "exit"):
        return Quit()
    if verb in ("help", "h", "?"):
        return Help()
    if verb in ("attach", "a"):
        args = rest.split()
        if len(args) == 1:
            return Attach(None, _rank(args[0]))
        if len(args) == 2:
            return Attach(args[0], _rank(args[1]))
        raise ValueError(_USAGE["attach"])
    if verb == "cast":
        parts = rest.split(None, 1)
        if len(parts) < 2:
            raise ValueError(_USAGE["cast"])
        actor, rest = parts[0], parts[1].lstrip()
        if rest.startswith("ranks("):
            end = rest.find(")")
            if end < 0:
                raise ValueError(f"ranks( without its closing parenthesis; {_USAGE['cast']}")
            spec, command = rest[: end + 1], rest[end + 1 :].strip()
        else:
            spec, _, command = rest.partition(" ")
            command = command.strip()
        if not command:
            raise ValueError(f"no pdb command to cast; {_USAGE['cast']}")
        return Cast(actor, parse_ranks(spec), command)
    raise ValueError(f"unknown command {verb!r}; type `help` for the commands")
