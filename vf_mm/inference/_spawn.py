"""``VLLMServers``: N vLLM servers of one model, subprocesses of this one for a ``with`` block.

Each server runs ``COMMAND --model MODEL --host HOST --port PORT`` plus the flags
``VLLMBackend`` needs from it (``server_flags``) and the caller's extra arguments, on its
own GPUs (``CUDA_VISIBLE_DEVICES``: the i-th slice of ``gpus_per_server``), with its
output in ``log_dir/server-<i>.log``. Entering the block starts them all at once and
waits until every ``GET /health`` answers 200 (``on_progress`` hears how many do); a
server that exits first, or a wait past ``startup_timeout_s``, stops them all and raises
``BackendUnavailableError`` with the end of its log.

No orphans, however the parent ends:

- leaving the block (normally, by an exception, by Ctrl-C's ``KeyboardInterrupt``) stops
  them: SIGTERM to each server's process group (vLLM's engine processes are in it),
  SIGKILL to what is left after ``stop_timeout_s``;
- a parent that dies without running its exit code (``kill -9``, a crash, SIGTERM's
  default action) is seen by a watchdog (``_watchdog.py``): a small process of its own,
  reading a pipe only the parent writes to. The kernel closes the pipe when the parent
  dies, whatever killed it, and the watchdog stops the groups the same way.
- servers and watchdog run in sessions of their own: a Ctrl-C in the terminal reaches the
  parent alone, which stops the servers in order; a signal to the parent's process group
  does not reach them either.

``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that started the child ends
(a server started from a worker thread would die with it), and it reaches only the
direct child, not vLLM's engine processes.

A server that dies during the run is not restarted: ``VLLMBackend`` stops sending to it
(connection refused) and its sessions move to the others.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

from vf_mm.errors import BackendUnavailableError, MissingDependencyError
from vf_mm.inference._watchdog import stop_groups

__all__ = ["VLLMServers", "server_flags", "vllm_command"]

#: the environment variable that names the command starting one vLLM server
COMMAND_ENV = "VF_MM_VLLM_COMMAND"

_WATCHDOG = Path(__file__).with_name("_watchdog.py")
_HEALTH_PATH = "/health"
_POLL_S = 0.5
#: where ``_free_ports`` draws from (its top is cut to below the ephemeral range)
_PORT_RANGE = (20000, 32767)
#: how long a server must have run when it is called healthy (a real one takes far longer)
_SETTLE_S = 1.0
_RESERVED = ("--model", "--host", "--port")


def vllm_command() -> list[str]:
    """The command that starts one vLLM server, before its arguments: ``$VF_MM_VLLM_COMMAND``
    (split like a shell line), else this interpreter's vLLM
    (``python -m vllm.entrypoints.openai.api_server``), else ``vllm serve`` on ``PATH``."""
    text = os.environ.get(COMMAND_ENV, "").strip()
    if text:
        return shlex.split(text)
    if importlib.util.find_spec("vllm") is not None:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    found = shutil.which("vllm")
    if found:
        return [found, "serve"]
    raise MissingDependencyError(
        f"no vLLM here: install it (pip install vllm), put `vllm` on PATH, or set "
        f"{COMMAND_ENV} to the command that starts a server (e.g. "
        f"'/path/to/venv/bin/python -m vllm.entrypoints.openai.api_server')"
    )


def server_flags(
    *,
    mode: Literal["features", "content_parts"] = "features",
    limit_mm_per_prompt: Mapping[str, int] | None = None,
    gpus_per_server: int = 1,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The vLLM flags ``VLLMBackend`` needs, those ``extra_args`` does not already give.

    ``--enable-scale-out``: vLLM 0.32 serves the token-in/token-out route
    (``/inference/v1/generate``) only with it (or ``--tokens-only``).

    Args:
        mode: ``features`` adds ``--no-mm-device-do-normalize``, since the client sends
            pixel values already normalised and vLLM would normalise them again, silently
            (``VLLMBackend``'s module docstring).
        limit_mm_per_prompt: Adds ``--limit-mm-per-prompt`` when given (vLLM's default is
            999 per modality, and it sizes its memory profile by them).
        gpus_per_server: ``--tensor-parallel-size K`` for ``K`` GPUs per server.
        extra_args: The flags already given.
    """
    given = {a.split("=", 1)[0] for a in extra_args if a.startswith("-")}
    taken = sorted(given & set(_RESERVED))
    if taken:
        raise ValueError(
            f"{', '.join(taken)} {'is' if len(taken) == 1 else 'are'} set for each spawned "
            "server; leave them out of the extra vLLM arguments"
        )
    flags: list[str] = []
    if not given & {"--enable-scale-out", "--tokens-only"}:
        flags.append("--enable-scale-out")
    if mode == "features":
        if "--mm-device-do-normalize" in given:
            raise ValueError(
                "--mm-device-do-normalize would normalise the features VLLMBackend sends a "
                "second time (wrong images, no error): use mode='content_parts' instead"
            )
        if "--no-mm-device-do-normalize" not in given:
            flags.append("--no-mm-device-do-normalize")
    elif mode != "content_parts":
        raise ValueError(f"mode must be 'features' or 'content_parts', got {mode!r}")
    if limit_mm_per_prompt is not None:
        if "--limit-mm-per-prompt" in given:
            raise ValueError("media limits given twice: as limit_mm_per_prompt and in the args")
        limits = ",".join(f'"{k}":{int(v)}' for k, v in limit_mm_per_prompt.items())
        flags += ["--limit-mm-per-prompt", "{" + limits + "}"]
    if gpus_per_server > 1 and not given & {"--tensor-parallel-size", "-tp"}:
        flags += ["--tensor-parallel-size", str(gpus_per_server)]
    return flags


class VLLMServers:
    """``n`` vLLM servers of ``model``, each on its own GPUs and port.

    ``base_urls`` is what ``VLLMBackend`` takes. Use it as ``with VLLMServers(...) as
    servers:``, or ``start()`` / ``wait_healthy()`` / ``stop()`` by hand.

    Args:
        model: The checkpoint (a path or a Hub id).
        n: How many servers.
        gpus_per_server: GPUs each server gets (0: leave ``CUDA_VISIBLE_DEVICES`` as it
            is, for CPU servers).
        gpus: The device ids to hand out, in order (default: this process's
            ``CUDA_VISIBLE_DEVICES``, else ``0 .. n * gpus_per_server - 1``).
        mode: See ``server_flags``.
        limit_mm_per_prompt: See ``server_flags``.
        extra_args: More vLLM arguments, the same for every server.
        command: What starts one server, before its arguments (default
            ``vllm_command()``).
        host: The address the servers listen on.
        base_port: Server ``i`` listens on ``base_port + i`` (default: free ports).
        log_dir: Where ``server-<i>.log`` go (default: a new temporary folder, kept).
        env: Variables added to this process's environment for the servers.
        startup_timeout_s: How long the servers may take to become healthy; past it (or
            when a server exits first) they are all stopped and starting raises.
        stop_timeout_s: How long a server has after SIGTERM before SIGKILL.
        on_progress: ``on_progress(ready, total, elapsed_s)``, called about twice a second
            while waiting for health.

    Raises:
        ValueError: A timeout not above 0, or arguments that do not go together.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        n: int = 1,
        *,
        gpus_per_server: int = 1,
        gpus: Sequence[str | int] | None = None,
        mode: Literal["features", "content_parts"] = "features",
        limit_mm_per_prompt: Mapping[str, int] | None = None,
        extra_args: Sequence[str] = (),
        command: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        base_port: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 1800.0,
        stop_timeout_s: float = 30.0,
        on_progress: Callable[[int, int, float], None] | None = None,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        if isinstance(gpus_per_server, bool) or not isinstance(gpus_per_server, int):
            raise ValueError(f"gpus_per_server must be an int >= 0, got {gpus_per_server!r}")
        if gpus_per_server < 0:
            raise ValueError(f"gpus_per_server must be an int >= 0, got {gpus_per_server!r}")
        if not startup_timeout_s > 0 or not stop_timeout_s > 0:
            raise ValueError("startup_timeout_s and stop_timeout_s must be > 0")
        self.model = str(model)
        self.n = n
        self.gpus_per_server = gpus_per_server
        self.host = host
        self.extra_args = [str(a) for a in extra_args]
        self.flags = server_flags(
            mode=mode,
            limit_mm_per_prompt=limit_mm_per_prompt,
            gpus_per_server=gpus_per_server,
            extra_args=self.extra_args,
        )
        self.command = list(command) if command is not None else None
        self.devices = _devices(n, gpus_per_server, gpus)
        self.base_port = base_port
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.env = dict(env or {})
        self.startup_timeout_s = float(startup_timeout_s)
        self.stop_timeout_s = float(stop_timeout_s)
        self.on_progress = on_progress
        self.ports: list[int] = []
        self.commands: list[list[str]] = []
        self.log_paths: list[Path] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._stopped = False

    # -- public ---------------------------------------------------------------------

    @property
    def base_urls(self) -> list[str]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return [f"http://{host}:{port}" for port in self.ports]

    @property
    def pids(self) -> list[int]:
        """The servers' process ids (each leads its process group)."""
        return [p.pid for p in self._procs]

    def start(self) -> VLLMServers:
        """Start the watchdog, then every server; returns at once (``wait_healthy`` waits)."""
        if self._procs or self._stopped:
            raise RuntimeError("these servers were started already (make a new VLLMServers)")
        command = self.command if self.command is not None else vllm_command()
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="vf-mm-vllm-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.ports = (
            [self.base_port + i for i in range(self.n)]
            if self.base_port is not None
            else _free_ports(self.host, self.n)
        )
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", str(_WATCHDOG), str(self.stop_timeout_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._started_at = time.monotonic()
        try:
            for i, port in enumerate(self.ports):
                self._start_one(i, command, port)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self) -> None:
        """Wait until every server answers ``GET /health`` with 200. A server that exits
        first, or a wait past ``startup_timeout_s``, stops them all and raises
        ``BackendUnavailableError`` (with the end of the log)."""
        if not self._procs or self._stopped:
            raise RuntimeError("start() the servers first")
        ready = [False] * self.n
        try:
            while True:
                for i, proc in enumerate(self._procs):
                    if ready[i]:
                        continue
                    code = proc.poll()
                    if code is not None:
                        raise BackendUnavailableError(
                            f"vLLM server {i} ({self.base_urls[i]}) exited with code {code} "
                            f"before {_HEALTH_PATH} answered; {self._log_tail(i)}",
                            backend=self.base_urls[i],
                        )
                    ready[i] = _healthy(self.host, self.ports[i])
                elapsed = time.monotonic() - self._started_at
                if self.on_progress is not None:
                    self.on_progress(sum(ready), self.n, elapsed)
                if all(ready):
                    self._check_running()
                    return
                if elapsed > self.startup_timeout_s:
                    slow = ready.index(False)
                    raise BackendUnavailableError(
                        f"vLLM server {slow} ({self.base_urls[slow]}) not healthy after "
                        f"{self.startup_timeout_s:g} s; {self._log_tail(slow)}",
                        backend=self.base_urls[slow],
                    )
                time.sleep(_POLL_S)
        except BaseException:
            self.stop()
            raise

    def _check_running(self) -> None:
        """Every server still runs ``_SETTLE_S`` after its start: one that failed to bind
        its port exits within that, while another program on the port answered for it."""
        time.sleep(max(0.0, self._started_at + _SETTLE_S - time.monotonic()))
        for i, proc in enumerate(self._procs):
            code = proc.poll()
            if code is not None:
                raise BackendUnavailableError(
                    f"vLLM server {i} ({self.base_urls[i]}) exited with code {code} right "
                    f"after {_HEALTH_PATH} answered (another program on its port?); "
                    f"{self._log_tail(i)}",
                    backend=self.base_urls[i],
                )

    def exit_codes(self) -> list[int | None]:
        """Each server's exit code (negative: the signal that ended it), None while it runs."""
        return [p.poll() for p in self._procs]

    def stop(self) -> None:
        """Stop every server (SIGTERM to its group, SIGKILL after ``stop_timeout_s``) and
        the watchdog. Calling it again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        procs = self._procs
        stop_groups([p.pid for p in procs], self.stop_timeout_s)
        for proc in procs:  # reap the leaders (killed, so this is quick)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            self._tell(watchdog, "".join(f"-{p.pid}\n" for p in procs))
            if watchdog.stdin is not None:
                watchdog.stdin.close()  # EOF with nothing registered: it exits
            try:
                watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                watchdog.kill()
        logs, self._logs = self._logs, []
        for log in logs:
            log.close()

    def __enter__(self) -> VLLMServers:
        self.start()
        self.wait_healthy()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"VLLMServers({self.model!r}, n={self.n}, base_urls={self.base_urls!r})"

    # -- helpers ----------------------------------------------------------------------

    def _start_one(self, i: int, command: list[str], port: int) -> None:
        assert self.log_dir is not None and self._watchdog is not None
        argv = [
            *command,
            "--model", self.model,
            "--host", self.host,
            "--port", str(port),
            *self.flags,
            *self.extra_args,
        ]  # fmt: skip
        env = {**os.environ, **self.env}
        devices = self.devices[i]
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        path = self.log_dir / f"server-{i}.log"
        log = open(path, "wb")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        devices = "unchanged" if self.devices[i] is None else self.devices[i]
        log.write(f"# vf-mm: {shlex.join(argv)}  (CUDA_VISIBLE_DEVICES {devices})\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group (and no Ctrl-C from the terminal)
        )
        self._procs.append(proc)
        self.commands.append(argv)
        self.log_paths.append(path)
        self._tell(self._watchdog, f"+{proc.pid}\n")

    @staticmethod
    def _tell(watchdog: subprocess.Popen[bytes], text: str) -> None:
        if watchdog.stdin is None or not text:
            return
        try:
            watchdog.stdin.write(text.encode())
            watchdog.stdin.flush()
        except (BrokenPipeError, ValueError):  # it is gone: nothing left to tell it
            pass

    def _log_tail(self, i: int, lines: int = 40) -> str:
        path = self.log_paths[i]
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"log {path} (unreadable)"
        return f"log {path}, last lines:\n" + "\n".join(text)


def _devices(n: int, per_server: int, gpus: Sequence[str | int] | None) -> list[str | None]:
    """Each server's ``CUDA_VISIBLE_DEVICES`` (None: left as it is)."""
    if per_server == 0:
        if gpus is not None:
            raise ValueError("gpus given with gpus_per_server=0")
        return [None] * n
    if gpus is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        ids = [g.strip() for g in visible.split(",") if g.strip()] if visible else None
        if ids is None:
            ids = [str(i) for i in range(n * per_server)]
    else:
        ids = [str(g) for g in gpus]
    if len(ids) < n * per_server:
        raise ValueError(
            f"{n} servers x {per_server} GPUs need {n * per_server} GPUs, but only "
            f"{len(ids)} are given ({','.join(ids) or 'none'})"
        )
    return [",".join(ids[i * per_server : (i + 1) * per_server]) for i in range(n)]


def _free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct ports free now, drawn at random below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(port 0)`` or an outgoing connection can be taken
    by any process between this check and the server's own bind; the server then fails to
    start while whatever took the port answers its health check, and requests meant for it
    go elsewhere. Ports below the ephemeral range are never handed out that way, so only
    another program choosing ports by hand can collide (``wait_healthy`` then still sees
    our server exit)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = _PORT_RANGE[0], min(_PORT_RANGE[1], _ephemeral_start() - 1)
    rng = random.SystemRandom()
    ports: list[int] = []
    for _ in range(50 * n):
        port = rng.randint(low, high)
        if port in ports:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise BackendUnavailableError(f"found no {n} free ports on {host} in {low}-{high}")


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's file; 32768 elsewhere, the
    lowest default among Linux, macOS and Windows)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _healthy(host: str, port: int) -> bool:
    """``GET /health`` answers 200 (directly: never through a proxy)."""
    connection = http.client.HTTPConnection(host, port, timeout=2.0)
    try:
        connection.request("GET", _HEALTH_PATH)
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
