"""The fork server of a host: ``python -m monarch._src.actor.forkserver``.

A host starts this module once per Python program and forks every proc from it, so a
proc does not pay for starting an interpreter and importing monarch (about 80 ms of
CPU each). The host talks to it over a Unix ``SOCK_SEQPACKET`` socket whose descriptor
is in ``MONARCH_FORK_SERVER_FD``; the protocol and its invariants are documented with
the host (``hyperactor_mesh::host``'s template module). In short: ``S`` requests fork
a child with the given variables and three descriptors (its stdin, stdout and stderr);
the server answers ``P`` (forked) or ``F`` (failed), reports ``X`` when a child exits
*without reaping it*, and reaps it when the host answers ``R``.

The server stays single-threaded and never starts monarch's runtime, so a fork copies
no threads or sockets. It freezes what it holds (``gc.freeze``) before each fork: the
preloaded modules' objects are outside every collection of its children, so a proc's
collections neither scan them nor copy the pages they share with the server; a stopping
proc's collections and finalization cost about a third as much.

A forked child makes itself a process group leader, asks for ``SIGKILL`` when the server
dies, takes its stdin, stdout and stderr from the descriptors the host sent (pipes the
host reads: see ``docs/logging.md``), sets the variables, and runs the same entry point
as ``python -m monarch._src.actor.bootstrap``.
"""

from __future__ import annotations

import ctypes
import gc
import os
import select
import signal
import socket
import sys
import traceback

# Preload what every proc imports (the actor API's modules, its config, the extension,
# the breakpoint hook that serve_child installs).
from monarch._src.actor import bootstrap, runtime  # noqa: F401
from monarch._src.actor.debugger import remote_pdb  # noqa: F401

_FD_ENV = "MONARCH_FORK_SERVER_FD"
_PR_SET_PDEATHSIG = 1
_MAX_MESSAGE = 4 << 20


def _raw_status(info: os.waitid_result) -> int:
    """The ``waitpid`` status word of an exit ``waitid`` observed."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    if info.si_code == os.CLD_DUMPED:
        return (info.si_status & 0x7F) | 0x80
    return info.si_status & 0x7F


class _ProcDone(BaseException):
    """Raised in a forked proc whose ``serve_child`` returned (it stopped normally): it
    unwinds the fork server's frames, which the child inherited, to :func:`main`."""


class _Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.live: set[int] = set()  # forked, exit not reported
        self.reported: set[int] = set()  # exit reported, not reaped
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # The host stops us by closing the socket (or, when it dies, by SIGKILL).
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def send(self, text: str) -> None:
        try:
            self.sock.send(text.encode())
        except OSError:
            pass  # the host is gone; the read loop sees it next

    def run(self) -> None:
        while True:
            ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [])
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
                self.report_exits()
            if self.sock.fileno() in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(self.sock, _MAX_MESSAGE, 3)
                except OSError:
                    data, fds = b"", []
                if not data:
                    return
                self.handle(data, fds)

    def handle(self, data: bytes, fds: list[int]) -> None:
        kind, body = data[:1], data[1:]
        if kind == b"S":
            self.fork(body, fds)
        elif kind == b"R":
            pid = int(body)
            if pid in self.reported:
                self.reported.discard(pid)
                os.waitpid(pid, 0)
        else:
            for fd in fds:
                os.close(fd)
            print(
                f"monarch fork server: ignoring a malformed request {data[:40]!r}", file=sys.stderr
            )

    def report_exits(self) -> None:
        for pid in list(self.live):
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
                self.live.discard(pid)
                continue
            if info is None:
                continue
            self.live.discard(pid)
            self.reported.add(pid)
            self.send(f"X{pid} {_raw_status(info)}")

    def end(self) -> None:
        """The end of the server: the host closed it (no proc of its is left) or is
        gone. It takes along whatever is left (children also have a parent-death
        signal), reaps it, and leaves at once: nothing of its needs the interpreter's
        finalization, which is slow with preloaded modules (torch)."""
        for pid in self.live | self.reported:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def fork(self, body: bytes, fds: list[int]) -> None:
        fields = body.split(b"\0")
        request = fields[0].decode()
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            self.send(f"F{request} expected 3 descriptors (stdin, stdout, stderr), got {len(fds)}")
            return
        env = {}
        for field in fields[1:]:
            key, _, value = field.partition(b"=")
            env[key.decode()] = value.decode()
        sys.stdout.flush()
        sys.stderr.flush()
        # What the server holds (the preloaded modules) is the children's too: moved out
        # of the collector's reach, so that no child's collection writes to those
        # objects' headers and copies their pages (copy-on-write).
        gc.freeze()
        try:
            pid = os.fork()
        except OSError as e:
            self.send(f"F{request} {e}")
            for fd in fds:
                os.close(fd)
            return
        if pid == 0:
            self.become_proc(fds, env)  # never returns
        for fd in fds:
            os.close(fd)
        self.live.add(pid)
        self.send(f"P{request} {pid}")

    def become_proc(self, fds: list[int], env: dict[str, str]) -> None:
        """Run the proc in this forked child. A proc that stops normally unwinds to
        :func:`main` (:class:`_ProcDone`), which leaves through the interpreter's normal
        finalization; any other end leaves at once with its status."""
        code = 1
        try:
            server = os.getppid()
            os.setpgid(0, 0)
            if self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
            if os.getppid() != server:
                os._exit(1)  # the server died between fork and prctl
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            self.sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            os.environ.update(env)
            runtime.serve_child()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        else:
            raise _ProcDone()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _preload(argv: list[str]) -> None:
    """``--preload MODULE`` (repeatable): import MODULE before serving, so the procs
    forked from this template share it instead of each importing it (torch takes
    seconds and hundreds of MB to import; see ``monarch._src.actor.proc_mesh``)."""
    import importlib

    for flag, module in zip(argv[::2], argv[1::2], strict=False):
        if flag == "--preload":
            try:
                importlib.import_module(module)
            except Exception as e:  # the procs import it themselves (and see why)
                print(f"monarch fork server: cannot preload {module}: {e}", file=sys.stderr)


def main() -> None:
    fd = int(os.environ.pop(_FD_ENV))
    _preload(sys.argv[1:])
    sock = socket.socket(fileno=fd)
    server = _Server(sock)
    try:
        server.run()
    except _ProcDone:
        # Not the server: a proc forked from it that stopped normally. It ends as a
        # proc started with `python -m monarch._src.actor.bootstrap` does, with the
        # interpreter's normal finalization (bounded by serve_child's watchdog).
        return
    except BaseException:
        server.end()
        raise
    server.end()


if __name__ == "__main__":
    main()
