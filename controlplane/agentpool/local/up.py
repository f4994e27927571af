"""Run a local pool: check ports, start the processes in order, report endpoints, stop on a signal.

:class:`LocalPool` is an async context manager used by ``agentpool up``, ``agentpool demo`` and the
end-to-end tests: entering starts everything (or fails with nothing left running), leaving stops
everything and removes the generated work directory (unless the caller gave one). Setting
:attr:`LocalPool.keep_logs` before leaving copies the processes' logs there once every process has
stopped (their last lines included), so that a failed run can be diagnosed after its work
directory is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import tempfile
from pathlib import Path
from types import TracebackType

from agentpool.api import AgentServingPool
from agentpool.local.pool import LocalOptions, PoolPlan, PortInUse, plan, port_free
from agentpool.local.supervisor import Running, StartError, Supervisor


class LocalPool:
    def __init__(
        self,
        pool: AgentServingPool,
        options: LocalOptions,
        workdir: Path | None = None,
        say: object = print,
    ) -> None:
        self.pool = pool
        self.options = options
        self._given_workdir = workdir
        self._say = say if callable(say) else print
        self.supervisor = Supervisor()
        self.plan: PoolPlan | None = None
        self.workdir: Path | None = None
        # where to copy logs/ when the pool stops (None: nowhere); replaces what is there
        self.keep_logs: Path | None = None
        self.kept_logs: Path | None = None  # where they were copied, once they were

    async def __aenter__(self) -> LocalPool:
        opts = self.options
        if not port_free(opts.host, opts.router_port):
            raise PortInUse(
                f"port {opts.router_port} on {opts.host} is in use (the router's): stop what listens there "
                "or pass --port"
            )
        if opts.redis_url is None and shutil.which("redis-server") is None:
            raise StartError(
                "redis-server is not on the PATH: install it (apt-get install redis-server, brew install "
                "redis) or pass --redis-url of a running Redis"
            )
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self.workdir = self._given_workdir
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="agentpool-"))  # 0700
        try:
            self.plan = plan(self.pool, opts, self.workdir)
            await self.supervisor.__aenter__()
            await self.supervisor.start_all(self.plan.specs, on_ready=self._ready)
        except BaseException:
            await self._cleanup()
            raise
        return self

    def _ready(self, run: Running) -> None:
        self._say(f"  {run.spec.name:12s} ready (pid {run.pid})")

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._cleanup()

    async def _cleanup(self) -> None:
        await self.supervisor.__aexit__(None, None, None)
        if self.keep_logs is not None and self.workdir is not None:
            self.kept_logs = await asyncio.to_thread(copy_logs, self.workdir / "logs", self.keep_logs)
        if self._given_workdir is None and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def watch(self, stop: asyncio.Event) -> int:
        """Until ``stop`` is set: 0. An essential process that exits ends the pool: 1. An engine
        that exits is reported and the pool runs on without it."""
        reported: set[int] = set()
        while not stop.is_set():
            for run in self.supervisor.exited():
                if run.pid in reported:
                    continue
                reported.add(run.pid)
                self._say(f"{run.spec.name} exited with code {run.proc.returncode}; log: {run.spec.log}")
                if run.spec.essential:
                    return 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        return 0


def copy_logs(logs: Path, dest: Path) -> Path | None:
    """Copy the log files of ``logs`` into ``dest`` (emptied first: no stale log of an earlier run
    stays beside them); ``dest``, or None when there was nothing to copy or the copy failed."""
    if not logs.is_dir():
        return None
    try:
        if dest.is_dir():
            shutil.rmtree(dest)
        shutil.copytree(logs, dest)
    except OSError:
        return None
    return dest


def endpoints_text(p: PoolPlan) -> str:
    lines = [f"pool {p.name!r} is up; work directory {p.workdir} (logs in logs/, roles in roles/)"]
    lines += [f"  {k:22s} {v}" for k, v in p.endpoints.items()]
    lines.append(
        f"try: curl -N {p.router_url}/v1/chat/completions -H 'content-type: application/json' -d "
        f'\'{{"model": "{p.model}", "stream": true, "messages": [{{"role": "user", "content": "hi"}}]}}\''
    )
    lines.append("Ctrl-C stops everything.")
    return "\n".join(lines)


async def serve(pool: AgentServingPool, options: LocalOptions, workdir: Path | None) -> int:
    """``agentpool up``: run until SIGINT/SIGTERM; every process stopped on the way out. When a
    process exited on its own and the work directory is a temporary one, its logs are kept in a new
    directory (``agentpool-logs-*`` in the temporary directory) whose path is printed."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        print(f"starting pool {pool.metadata.get('name', 'pool')!r}: {pool.spec.nodes} sim engines")
        try:
            async with LocalPool(pool, options, workdir) as local:
                assert local.plan is not None
                print(endpoints_text(local.plan), flush=True)
                code = await local.watch(stop)
                print("stopping ...", flush=True)
                if workdir is None and local.supervisor.exited():
                    local.keep_logs = Path(tempfile.mkdtemp(prefix="agentpool-logs-")) / "logs"
        except (StartError, PortInUse) as e:
            print(f"agentpool up: {e}", flush=True)
            return 1
        if local.kept_logs is not None:
            print(f"a process exited during the run; the pool's logs are in {local.kept_logs}", flush=True)
        print("stopped; no process left running", flush=True)
        return code
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
