"""The fuzzer's worker process and the harness that drives it.

The worker (``python tests/fuzz_worker.py``) limits its address space, imports
torch and ai3 once, then reads cases as JSON lines on stdin and answers each
with one JSON verdict line (from :func:`fuzz_check.run_case`). Its protocol
runs on a private copy of the original stdout; fd 1 goes to stderr, so
nothing printed by torch or ai3 can corrupt it.

:class:`Worker` (in the parent) sends one case at a time and waits with a
timeout: a worker that does not answer in time is killed (verdict ``hang``);
one that dies (an abort, a signal, an exit) gives ``abort`` with its exit
status and the tail of its stderr. Either way the next case starts a fresh
worker. ``--test-kinds`` lets the worker take the cases ``abort``, ``hang``,
``exit`` and ``raise`` that prove the harness catches each of them; the
strategies never draw them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: Default address-space limit of a worker: torch's CUDA build maps about 3.6 GB
#: at import, so this leaves ~2.4 GB for a case; larger allocations fail.
MEMORY_LIMIT = 6 * 2**30


def _ai3_root() -> str:
    """The folder holding the ai3 package this process would import.

    The worker must test the same ai3 as its parent: an installed wheel when the
    parent imports one (a clean clone's ``python/ai3`` has no compiled ``_core``),
    else the source tree's ``python/`` (a development build in place).
    """
    spec = importlib.util.find_spec("ai3")
    if spec is None or spec.origin is None:
        return str(ROOT / "python")
    return str(Path(spec.origin).resolve().parent.parent)


def _import_checker(threads: int):
    """Imports torch, ai3 and the checker (once) and sets the thread counts."""
    import ai3
    import fuzz_check
    import torch

    if not getattr(_import_checker, "done", False):
        torch.set_num_threads(1)  # the reference; ai3 gets threads to reach its parallel paths
        ai3.set_num_threads(threads)
        _import_checker.done = True
    return fuzz_check


def _serve(memory_limit: int, threads: int, test_kinds: bool) -> int:
    import resource

    if memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if not test_kinds:  # imported now, so a case's time does not include them
        _import_checker(threads)
    proto.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        case = json.loads(line)
        kind = case.get("kind")
        if test_kinds and kind == "abort":
            os.abort()
        elif test_kinds and kind == "hang":
            time.sleep(10**6)
        elif test_kinds and kind == "exit":
            os._exit(3)
        elif test_kinds and kind == "raise":
            raise RuntimeError("a bug in the harness")
        try:
            verdict = _import_checker(threads).run_case(case)
        except Exception as e:  # a bug in the checker, not in ai3: report it, keep serving
            verdict = {"verdict": "harness_error", "detail": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(verdict) + "\n")
    return 0


class Worker:
    """One worker process, restarted after it dies or hangs.

    ``run(case)`` returns the verdict dict; the harness's own verdicts are
    ``hang`` (no answer within ``timeout`` seconds), ``abort`` (the worker
    died: ``returncode``, negative for a signal, and ``stderr`` tail) and
    ``harness_error`` (an answer that is not a verdict)."""

    def __init__(
        self,
        timeout: float = 60.0,
        memory_limit: int = MEMORY_LIMIT,
        threads: int = 2,
        test_kinds: bool = False,
        startup_timeout: float = 120.0,
    ):
        self.timeout = timeout
        self.memory_limit = memory_limit
        self.threads = threads
        self.test_kinds = test_kinds
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.stderr_file = None
        self._buf = b""
        self._eof = False
        #: How many worker processes were started (1 + restarts).
        self.starts = 0

    # ---- process management ------------------------------------------------------------------

    def _start(self) -> None:
        self.stderr_file = tempfile.TemporaryFile()
        env = dict(os.environ)
        paths = [_ai3_root(), str(TESTS), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        env.setdefault("RUST_BACKTRACE", "1")
        cmd = [sys.executable, "-u", str(Path(__file__).resolve()), "--serve",
               "--memory-limit", str(self.memory_limit), "--threads", str(self.threads)]  # fmt: skip
        if self.test_kinds:
            cmd.append("--test-kinds")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr_file, env=env
        )
        self._buf = b""
        self._eof = False
        self.starts += 1
        line = self._readline(time.monotonic() + self.startup_timeout)
        if line is None or "ready" not in json.loads(line):
            _, tail = self._stop()
            raise RuntimeError(f"fuzz worker failed to start: {line!r}\n{tail}")

    def _stop(self) -> tuple[int | None, str]:
        """Kills the worker if it lives; returns its exit status and stderr tail."""
        if self.proc is None:
            return None, ""
        if self._eof:  # it closed its end: let it finish dying to get its real status
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        returncode = self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.proc = None
        tail = ""
        if self.stderr_file is not None:
            self.stderr_file.seek(0, os.SEEK_END)
            size = self.stderr_file.tell()
            self.stderr_file.seek(max(0, size - 65536))
            tail = self.stderr_file.read().decode(errors="replace")
            self.stderr_file.close()
            self.stderr_file = None
        return returncode, tail

    def close(self) -> None:
        """Stops the worker."""
        self._stop()

    def _readline(self, deadline: float) -> str | None:
        """The next line from the worker, or None on EOF or at the deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self._eof = True
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    # ---- running cases -----------------------------------------------------------------------

    def start(self) -> Worker:
        """Starts the worker unless it runs; raises ``RuntimeError`` if it cannot start."""
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self._stop()
            self._start()
        return self

    def run(self, case: dict) -> dict:
        """The verdict for ``case`` (see the module doc for the harness's own)."""
        self.start()
        assert self.proc is not None and self.proc.stdin is not None
        start = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps(case) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died; readline sees EOF
        line = self._readline(start + self.timeout)
        if line is not None:
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return {"verdict": "harness_error", "detail": f"bad answer {line[:200]!r}"}
        hung = not self._eof and self.proc.poll() is None
        returncode, tail = self._stop()
        if hung:
            return {
                "verdict": "hang",
                "seconds": round(time.monotonic() - start, 1),
                "stderr": tail[-1500:],
            }
        return {
            "verdict": "abort",
            "returncode": returncode,
            "signal": _signal_name(returncode),
            "crash": crash_line(tail),
            "stderr": tail[-1500:],
        }

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_CRASH = re.compile(
    r"memory allocation of|panicked at|Fatal Python error|Segmentation fault|Assertion|terminate called|Error"
)


def crash_line(stderr: str) -> str:
    """The line of a dead worker's stderr that says why it died (the last one that looks
    like a crash message), or ''."""
    lines = [ln.strip() for ln in stderr.splitlines() if _CRASH.search(ln)]
    return lines[-1][:300] if lines else ""


def _signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--serve", action="store_true", help="run as a worker (stdin/stdout protocol)"
    )
    parser.add_argument("--memory-limit", type=int, default=MEMORY_LIMIT)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--test-kinds", action="store_true")
    args = parser.parse_args(argv)
    if not args.serve:
        parser.error("use --serve (the harness starts workers itself)")
    return _serve(args.memory_limit, args.threads, args.test_kinds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
