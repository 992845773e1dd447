"""The entry point of a proc spawned by a host agent:
``python -m monarch._src.actor.bootstrap``.

It serves this process's proc, opens its inbox, reports ready to the host, then runs
the agent (spawn requests) on the main thread until the host asks it to stop (its
stdin closes), and exits.
"""

from __future__ import annotations

import os
import sys
import threading

from monarch._rust_bindings import BootChild
from monarch._src.actor import runtime


def main() -> None:
    child = BootChild.serve("unix")
    ctx = runtime.ProcessContext(
        child.proc, is_root=False, root_port=os.environ.get(runtime.ROOT_PORT_ENV)
    )
    runtime.set_process_context(ctx)

    def wait_for_stop() -> None:
        child.wait_for_stop()
        ctx.agent_queue.close()

    threading.Thread(target=wait_for_stop, name="monarch-stop", daemon=True).start()
    child.report_ready()
    ctx.run_agent()
    sys.stdout.flush()
    sys.stderr.flush()
    # Actor threads are daemons and the host decided we stop: leave without joining.
    os._exit(0)


if __name__ == "__main__":
    main()
