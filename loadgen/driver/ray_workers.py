"""Workers as Ray actors (``loadgen run ... --ray [ADDRESS]``): Ray places them, watches them, carries them.

Ray is an optional extra (``pip install 'loadgen[ray]'``), imported only here and only when asked for.
Without an address a local Ray is started (and shut down at the end); with one (``auto``,
``ray://HOST:10001``, ``HOST:6379``) the run joins that cluster. Each actor (one CPU each, so Ray spreads
them over the cluster's cores and nodes) runs the same worker as a local process does
(``worker_main.serve_worker``): it connects back to the coordinator's control channel on the driver
node's IP address, measures its clock offset, and writes its shard into the run directory.

Storage: actors write their part files straight into the run directory, so every node must see that
directory at the same path (a shared filesystem: NFS, a mounted bucket, or one host). That keeps the
one write path (part files, synced and renamed into place, survive the actor's death) instead of sending
shard bytes back through Ray's object store, which would lose a killed actor's flushed rows.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from loadgen.util.errors import LoadgenError
from loadgen.util.inputs import without_userinfo

from .options import RunOptions
from .worker_main import serve_worker_sync

__all__ = ["RayLauncher", "import_ray"]

INSTALL_HINT = "--ray: Ray is not installed: expected it as the optional extra (pip install 'loadgen[ray]')"


def import_ray() -> Any:
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray  # deferred: Ray is an optional extra, imported only for --ray
    except ImportError:
        raise LoadgenError(INSTALL_HINT) from None
    return ray


def _init_keeping_signals(ray: Any, kwargs: dict[str, Any]) -> None:
    """``ray.init``, then loadgen's own SIGINT/SIGTERM/SIGHUP handlers back (Ray's driver installs handlers
    that abort the process, which would leave the workers' shards unclosed and the run unaccounted)."""
    main = threading.current_thread() is threading.main_thread()
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {sig: signal.getsignal(sig) for sig in signals} if main else {}
    try:
        ray.init(**kwargs)
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


class _WorkerActor:
    """The actor: one worker of the run (a class Ray wraps with ``ray.remote`` at launch)."""

    def run(self, address: str, token: str, worker_id: int) -> int:
        import ray  # deferred: runs inside the Ray actor, where ray is loaded

        return serve_worker_sync(address, token, worker_id, node_ip=ray.util.get_node_ip_address())

    def pid(self) -> int:
        return os.getpid()


class _RayHandle:
    def __init__(self, ray: Any, actor: Any, ref: Any) -> None:
        self.ray, self.actor, self.ref = ray, actor, ref

    def exit_status(self) -> str | None:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            return f"exit code {self.ray.get(self.ref)}"
        except self.ray.exceptions.RayActorError as exc:
            return f"actor died ({str(exc).splitlines()[0][:160]})"
        except self.ray.exceptions.RayError as exc:
            return f"actor failed ({str(exc).splitlines()[0][:160]})"

    def kill(self) -> None:
        self.ray.kill(self.actor, no_restart=True)


class RayLauncher:
    """Ray actors on the cluster at ``address`` (None: a local Ray with ``num_cpus`` CPUs)."""

    kind = "ray"
    address_label: str | None
    listen_host: str

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        self.ray = ray = import_ray()
        self.started_here = not ray.is_initialized()
        if self.started_here:
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "logging_level": logging.ERROR,
                "log_to_driver": False,
                "configure_logging": True,
            }
            if address:
                kwargs["address"] = address
            else:
                kwargs["num_cpus"] = num_cpus
            try:
                _init_keeping_signals(ray, kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = without_userinfo(address) if address else "a local Ray"
                raise LoadgenError(
                    f"--ray {where}: cannot start or join Ray ({str(exc).splitlines()[0][:200]}): "
                    "expected a reachable Ray cluster address, or none for a local Ray"
                ) from None
        self.address_label = without_userinfo(address) if address else "local"
        self.listen_host = ray.util.get_node_ip_address() if address else "127.0.0.1"
        self.actor_class = ray.remote(num_cpus=1, max_restarts=0)(_WorkerActor)

    def start(self, worker_id: int, address: str, token: str, log_path: Path, options: RunOptions) -> _RayHandle:
        env = {}
        if options.api_key_env and os.environ.get(options.api_key_env):  # the key reaches the actor, never a file
            env[options.api_key_env] = os.environ[options.api_key_env]
        actor = self.actor_class.options(name=None, runtime_env={"env_vars": env} if env else None).remote()
        return _RayHandle(self.ray, actor, actor.run.remote(address, token, worker_id))

    def close(self) -> None:
        if self.started_here:
            self.ray.shutdown()
