"""``python -m monarch.tools.worker --addr ADDRESS``: run this machine's worker until
terminated, as ``monarch worker --address ADDRESS`` does, with the same options (see
:mod:`monarch.tools.cli`); clients attach with ``attach_to_workers``."""

import sys

from monarch._src.cli.parser import main

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
