"""A long-lived `vllm bench serve`: vLLM's own benchmark module, one process for all points of a session.

Run as ``python client_worker.py`` (stdlib and the installed vLLM only; it never imports `suite`, so the same
file runs inside an arm's container image). Protocol, one JSON object per line:

- on start it prints a handshake on stdout: ``{"ready": true, "vllm": "<version>", "interface": "module",
  ...}``, or ``{"ready": false, "error": "..."}`` when this vLLM's benchmark module is not the one the CLI
  runs (the caller then falls back to the CLI);
- then it reads requests on stdin: ``{"id": ..., "argv": [the arguments after `vllm bench serve`],
  "timeout_s": optional, "log": optional path for this point's output}``; the arguments are parsed by vLLM's
  own parser (same flags, same defaults as the CLI) and run by ``vllm.benchmarks.serve.main_async`` in this
  process's one event loop, so vLLM's own code writes the result JSON (``--save-result --result-dir
  --result-filename``, the CLI's keys);
- for each request it prints one answer: ``{"id", "ok", "error", "timed_out", "wall_s", "client_cpu_s",
  "client_cpu_util", "bench_wall_s", "bench_cpu_s"}``. ``client_cpu_s`` is this process's user+sys CPU time
  (all threads) over the point, ``bench_*`` cover only vLLM's ``benchmark()`` call (ready check, warm-ups and
  the measured requests; not the tokenizer load or the dataset sampling).

stdout carries only protocol lines: everything vLLM prints goes to stderr (the log). An exception in a point
is answered ``ok: false`` with the traceback tail, and the worker keeps serving. EOF on stdin ends it.

Cached across points: the tokenizer, through vLLM's own ``cached_get_tokenizer`` (an ``lru_cache`` of
``get_tokenizer``, keyed on the same arguments). The dataset is sampled per point, as the CLI does (it is
seeded, and cheap next to the requests). The heap frozen by each point's ``freeze_gc_heap`` stays frozen (see
``Bench.__init__``), so a point does not pay a full garbage collection of vLLM's imports.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import sys
import time
import traceback

# Keep the real stdout for the protocol; from here on fd 1 and sys.stdout both go to stderr, so nothing vLLM
# (or a C extension) prints can corrupt a protocol line.
_PROTOCOL = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr

TRACEBACK_LINES = 15


def send(message: dict) -> None:
    _PROTOCOL.write(json.dumps(message, default=str) + "\n")
    _PROTOCOL.flush()


def log(text: str) -> None:
    sys.stderr.write(f"[client_worker {time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class ArgvError(Exception):
    """vLLM's parser rejected the arguments (argparse would print usage and exit 2)."""


class PointTimeout(Exception):
    """The point ran past the caller's timeout and was cancelled."""


class Bench:
    """vLLM's benchmark module, checked against what `vllm bench serve` runs."""

    def __init__(self) -> None:
        import inspect

        import vllm

        self.version = getattr(vllm, "__version__", "unknown")
        if os.environ.get("VLLM_USE_RUST_BENCH", "0") not in ("", "0"):
            raise RuntimeError("VLLM_USE_RUST_BENCH is set: the CLI would run the Rust benchmark, "
                               "not this module")
        from vllm.benchmarks import serve as bench
        from vllm.entrypoints.cli.benchmark import serve as cli

        for name in ("add_cli_args", "main", "main_async"):
            if not callable(getattr(bench, name, None)):
                raise RuntimeError(f"vllm.benchmarks.serve has no {name}()")
        if not inspect.iscoroutinefunction(bench.main_async):
            raise RuntimeError("vllm.benchmarks.serve.main_async is not a coroutine function")
        # the CLI subcommand must call exactly these functions, and main() must only run main_async()
        if (getattr(cli, "main", None) is not bench.main
                or getattr(cli, "add_cli_args", None) is not bench.add_cli_args):
            raise RuntimeError("`vllm bench serve` does not call vllm.benchmarks.serve.main/add_cli_args")
        if "main_async" not in bench.main.__code__.co_names:
            raise RuntimeError("vllm.benchmarks.serve.main does not run main_async")
        if len(inspect.signature(bench.main_async).parameters) != 1:
            raise RuntimeError("vllm.benchmarks.serve.main_async does not take one argument (args)")
        self.bench = bench
        self._mirror_cli_setup()
        self.tokenizer_cache = self._cache_tokenizer()
        self.timed = self._time_benchmark()
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        # main_async collects and freezes the heap before each run (freeze_gc_heap), so the collector skips
        # static objects while requests are timed. Freeze the imports now, and leave every point's frozen
        # objects frozen (as the CLI does until it exits): each point's collection then scans only what is
        # new, instead of the whole ~700k-object heap (~0.5 s a point on 2 cores). Frozen objects are still
        # freed by reference counting; only cyclic garbage among them is kept.
        gc.collect()
        gc.freeze()

    @staticmethod
    def _mirror_cli_setup() -> None:
        """What vLLM's CLI entry point does before it dispatches `bench serve`."""
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # cli_env_setup()
        from vllm import platforms

        if platforms.current_platform.is_unspecified():  # `vllm bench`: CPU instead of UnspecifiedPlatform
            from vllm.platforms.cpu import CpuPlatform

            platforms.current_platform = CpuPlatform()

    def _cache_tokenizer(self) -> bool:
        try:
            from vllm.tokenizers import registry
        except ImportError:
            return False
        cached = getattr(registry, "cached_get_tokenizer", None)
        if cached is None or getattr(self.bench, "get_tokenizer", None) is not registry.get_tokenizer:
            return False
        self.bench.get_tokenizer = cached
        return True

    def _time_benchmark(self) -> bool:
        """Wrap ``benchmark()`` (looked up as a module global by main_async) to time the measured part."""
        inner = getattr(self.bench, "benchmark", None)
        if inner is None or "benchmark" not in self.bench.main_async.__code__.co_names:
            return False
        self.bench_wall_s: float | None = None
        self.bench_cpu_s: float | None = None

        async def timed_benchmark(*args, **kwargs):
            t0, c0 = time.perf_counter(), cpu_seconds()
            try:
                return await inner(*args, **kwargs)
            finally:
                self.bench_wall_s, self.bench_cpu_s = time.perf_counter() - t0, cpu_seconds() - c0

        self.bench.benchmark = timed_benchmark
        return True

    def parser(self):
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = FlexibleArgumentParser(prog="vllm bench serve",
                                        description="Benchmark the online serving throughput.")
        self.bench.add_cli_args(parser)

        def error(message: str):
            raise ArgvError(f"vllm bench serve: error: {message}")

        parser.error = error
        return parser

    def parse(self, argv: list[str]):
        parser = self.parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version: argparse prints and exits
            raise ArgvError(f"argument parsing exited (status {exc.code}); see the log") from None
        try:
            from vllm.logger import configure_logging_from_args
        except ImportError:
            return args
        configure_logging_from_args(args)  # as the CLI does for the subcommand's namespace
        return args

    def run(self, args, timeout_s: float | None) -> None:
        coro = self.bench.main_async(args)
        if timeout_s:
            coro = asyncio.wait_for(coro, timeout_s)
        t0 = time.perf_counter()
        try:
            self.loop.run_until_complete(coro)
        except asyncio.TimeoutError:  # noqa: UP041 - distinct before Python 3.11
            if timeout_s and time.perf_counter() - t0 >= 0.99 * timeout_s:
                raise PointTimeout() from None
            raise  # a timeout inside vLLM's code: an ordinary failure

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()


class point_log:
    """Send fds 1 and 2 to a per-point log file for the duration of one point."""

    def __init__(self, path: str | None):
        self.path = path
        self.saved: list[int] = []

    def __enter__(self):
        if self.path:
            sys.stderr.flush()
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.saved = [os.dup(1), os.dup(2)]
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved:
            sys.stderr.flush()
            os.dup2(self.saved[0], 1)
            os.dup2(self.saved[1], 2)
            for fd in self.saved:
                os.close(fd)
            self.saved = []


def answer(bench: Bench, request: dict) -> dict:
    rid = request.get("id")
    argv = request.get("argv")
    out: dict = {"id": rid, "ok": False, "error": None, "timed_out": False, "wall_s": 0.0,
                 "client_cpu_s": 0.0, "client_cpu_util": None, "bench_wall_s": None, "bench_cpu_s": None}
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        out["error"] = "bad request: 'argv' must be a list of strings"
        return out
    timeout_s = request.get("timeout_s")
    t0, c0 = time.perf_counter(), cpu_seconds()
    if bench.timed:
        bench.bench_wall_s = bench.bench_cpu_s = None
    with point_log(request.get("log")):
        log(f"point {rid}: vllm bench serve {' '.join(argv)}")
        try:
            bench.run(bench.parse(argv), float(timeout_s) if timeout_s else None)
            out["ok"] = True
        except ArgvError as exc:
            out["error"] = str(exc)
            log(str(exc))
        except PointTimeout:
            out["timed_out"] = True
            out["error"] = f"the point did not finish within {timeout_s} s (cancelled)"
        except SystemExit as exc:  # vLLM's code giving up the way a CLI does: this point only
            out["error"] = f"vLLM's benchmark code exited (status {exc.code})"
            log(out["error"])
        except Exception:  # noqa: BLE001 - any failure of one point is answered, the worker keeps serving
            text = traceback.format_exc().rstrip()
            log(f"point {rid} raised:\n{text}")
            out["error"] = "\n".join(text.splitlines()[-TRACEBACK_LINES:])
        out["wall_s"] = round(time.perf_counter() - t0, 6)
        out["client_cpu_s"] = round(cpu_seconds() - c0, 6)
        out["client_cpu_util"] = round(out["client_cpu_s"] / out["wall_s"], 4) if out["wall_s"] > 0 else None
        out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
        if bench.timed and bench.bench_wall_s is not None:
            out["bench_wall_s"] = round(bench.bench_wall_s, 6)
            out["bench_cpu_s"] = round(bench.bench_cpu_s or 0.0, 6)
        log(f"point {rid}: {'ok' if out['ok'] else 'failed'} in {out['wall_s']:.3f} s "
            f"(client CPU {out['client_cpu_s']:.3f} s)")
    return out


def main() -> int:
    t0 = time.perf_counter()
    try:
        bench = Bench()
    except Exception as exc:  # noqa: BLE001 - any import or interface problem means: use the CLI
        version = None
        try:
            import vllm

            version = getattr(vllm, "__version__", None)
        except Exception:  # noqa: BLE001
            pass
        log("not ready:\n" + traceback.format_exc())
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}", "vllm": version, "pid": os.getpid()})
        return 3
    send({"ready": True, "vllm": bench.version, "interface": "module", "pid": os.getpid(),
          "python": sys.version.split()[0], "module": bench.bench.__file__,
          "tokenizer_cache": bench.tokenizer_cache, "bench_timing": bench.timed,
          "startup_s": round(time.perf_counter() - t0, 3)})
    try:
        while True:
            line = sys.stdin.buffer.readline()
            if not line:
                return 0
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                send({"id": None, "ok": False, "error": f"bad request line (JSON expected): {exc}",
                      "timed_out": False})
                continue
            send(answer(bench, request))
    finally:
        bench.close()


if __name__ == "__main__":
    sys.exit(main())
