"""The test process's side of :mod:`tests.procs_zygote`: worker processes forked from one
that imported the client once, each behind the part of :class:`subprocess.Popen` the
concurrency suite uses (text pipes, ``pid``, ``poll``, ``wait``, ``kill``, ``returncode``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import IO, Any

_LOCK = threading.Lock()
_SERVER: _Zygote | None = None


class Forked:
    """One forked worker: its pipes, and its exit status once the fork server reported it."""

    def __init__(self, stdin: IO[str], stdout: IO[str], stderr: IO[str]) -> None:
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.pid = -1
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired("forked worker", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # (ended; its report is on its way)

    def ended(self, code: int) -> None:
        self.returncode = code
        self._ended.set()


class _Zygote:
    def __init__(self, env: dict[str, str], cwd: str) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.procs_zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )
        theirs.close()
        self.sock = mine
        self.cond = threading.Condition()
        self.next_id = 0
        self.pids: dict[int, int] = {}  # request id -> pid
        self.by_pid: dict[int, Forked] = {}
        self.exits: dict[int, int] = {}  # pid -> code reported before its Forked was known
        threading.Thread(target=self._read, daemon=True, name="procs-zygote").start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.sock.recv(1 << 16)
            except OSError:
                msg = b""
            if not msg:  # the fork server ended: nobody will report its workers' exits
                with self.cond:
                    self.sock.close()
                    for f in self.by_pid.values():
                        f.ended(-1)
                    self.by_pid.clear()
                    self.cond.notify_all()
                return
            m = json.loads(msg)
            with self.cond:
                if "exit" in m:
                    f = self.by_pid.pop(m["exit"], None)
                    if f is None:
                        self.exits[m["exit"]] = m["code"]
                    else:
                        f.ended(m["code"])
                else:
                    self.pids[m["id"]] = m["pid"]
                self.cond.notify_all()

    def spawn(self, cfg: dict[str, Any], env: dict[str, str]) -> Forked:
        fds = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr: (read, write)
        theirs = [fds[0][0], fds[1][1], fds[2][1]]
        proc = Forked(
            os.fdopen(fds[0][1], "w"), os.fdopen(fds[1][0], "r"), os.fdopen(fds[2][0], "r")
        )
        try:
            with self.cond:
                rid = self.next_id
                self.next_id += 1
                msg = json.dumps({"id": rid, "cfg": cfg, "env": env}).encode()
                socket.send_fds(self.sock, [msg], theirs)
                while rid not in self.pids:
                    if self.sock.fileno() < 0:
                        raise RuntimeError("the worker fork server ended")
                    self.cond.wait()
                proc.pid = self.pids.pop(rid)
                code = self.exits.pop(proc.pid, None)
                if code is None:
                    self.by_pid[proc.pid] = proc
                else:
                    proc.ended(code)
        finally:
            for fd in theirs:
                os.close(fd)
        return proc


def fork_worker(cfg: dict[str, Any], env: dict[str, str], cwd: str) -> Forked:
    """A worker (``tests.procs_worker``'s :func:`run` of ``cfg``) forked from this process's
    fork server, which is started (with ``env`` and ``cwd``) on first use; the worker gets
    ``env`` as its environment."""
    global _SERVER
    with _LOCK:
        if _SERVER is None or _SERVER.proc.poll() is not None:
            # (Its own clock true: each worker sets its skew from ``env`` after the fork.)
            _SERVER = _Zygote({**env, "FILEPULSAR_TEST_WALL_SKEW_MS": "0"}, cwd)
        server = _SERVER
    return server.spawn(cfg, env)
