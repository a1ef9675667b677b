"""A fork server for the concurrency suite's worker processes (tests/procs_worker.py).

Each worker used to be ``python -m tests.procs_worker``: a fresh interpreter importing the
client (numpy, pyarrow) and, for the S3 cases, s3fs, 0.6-1.0 s of CPU before its first
message; the suite starts 142 of them. This process imports all that once and forks a worker
per request, so each worker is still a process of its own (its own memory, its own pid: a
``kill`` is a real SIGKILL) that starts where the imports end.

Run by the test process as ``python -m tests.procs_zygote FD``, where FD is its end of a
``SOCK_SEQPACKET`` socket pair. A request is a JSON message ``{"id", "cfg", "env"}`` carrying
three descriptors (the worker's stdin, stdout, stderr); the answer is ``{"id", "pid"}``, and
``{"exit": pid, "code": returncode}`` (negative: the signal) once that worker has ended. The
socket's end (the test process gone) ends the server; its workers see their stdin close.
No thread runs here before a fork: the forked worker is the only thread it starts with.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import traceback

import tests.procs_worker as worker

with contextlib.suppress(ImportError):  # (the S3 cases' workers need it)
    import s3fs  # noqa: F401


def _child(sock: socket.socket, fds: list[int], req: dict[str, object]) -> None:
    """In the forked worker: its descriptors, environment and wall clock, then its role."""
    code = 1
    try:
        sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        env = req["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        worker.skew_wall_clock(int(env.get("FILEPULSAR_TEST_WALL_SKEW_MS", "0")))
        cfg = req["cfg"]
        assert isinstance(cfg, dict)
        worker.run(cfg)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(sock: socket.socket) -> None:
    """Fork a worker per request; report each worker's exit when its pidfd says it ended
    (no polling: the server sleeps in ``select`` until a request or an exit)."""
    pidfds: dict[int, int] = {}  # pidfd -> pid
    while True:
        ready, _, _ = select.select([sock, *pidfds], [], [])
        for fd in ready:
            if fd is sock:
                continue
            pid = pidfds.pop(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            sock.send(json.dumps({"exit": pid, "code": code}).encode())
        if sock not in ready:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not msg:
            return  # the test process is gone
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            for fd in pidfds:
                os.close(fd)
            _child(sock, fds, req)
        pidfds[os.pidfd_open(pid)] = pid
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
