"""Masters in Docker containers, for machines that have a Docker engine but no
redis-server binary (the test fixtures prefer a local binary: see conftest.py).

Each container publishes Redis on 127.0.0.1 only, on a free port that survives
kill/start and restart, and keeps no data (no persistence), like LocalEnsemble.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from helpers import free_port

IMAGE = "redis:7"


def docker_available() -> bool:
    """Whether testcontainers is installed and a Docker engine answers."""
    try:
        import docker

        docker.from_env().ping()
    except Exception:
        return False
    return True


class ContainerServer:
    """One Redis master in a container, with LocalServer's test-facing methods."""

    def __init__(self, image: str = IMAGE) -> None:
        from testcontainers.core.container import DockerContainer

        self.port = free_port()
        self._container: Any = (
            DockerContainer(image)
            .with_command("redis-server --save '' --appendonly no")
            .with_bind_ports(6379, ("127.0.0.1", self.port))  # type: ignore[arg-type]
        )
        self._started = False
        self.running = False
        self.paused = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _docker(self) -> Any:
        return self._container.get_wrapped_container()

    def start(self) -> None:
        if self.running:
            return
        if self._started:
            self._docker().start()
        else:
            self._container.start()
            self._started = True
        self.running = True
        self._wait_ready()

    def kill(self) -> None:
        if self.running:
            if self.paused:
                self.resume()
            self._docker().kill()
            self.running = False

    def pause(self) -> None:
        self._docker().pause()
        self.paused = True

    def resume(self) -> None:
        self._docker().unpause()
        self.paused = False

    def restart(self) -> None:
        if self.paused:
            self.resume()
        self._docker().restart(timeout=1)
        self.running = True
        self._wait_ready()

    def stop(self) -> None:
        if self._started:
            self._container.stop()
        self.running = self.paused = False

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5) as r:
                    r.ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class ContainerEnsemble:
    """N containerised masters with the parts of LocalEnsemble's API the tests use."""

    def __init__(self, size: int = 5, image: str = IMAGE) -> None:
        self.servers = [ContainerServer(image) for _ in range(size)]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def __getitem__(self, index: int) -> ContainerServer:
        return self.servers[index]

    def __enter__(self) -> ContainerEnsemble:
        try:
            for server in self.servers:
                server.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def _reachable(self) -> list[ContainerServer]:
        return [s for s in self.servers if s.running and not s.paused]

    def flushall(self) -> None:
        for server in self._reachable():
            with redis.Redis(port=server.port, socket_timeout=5) as r:
                r.flushall()

    def keys(self, pattern: str = "*") -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for server in self._reachable():
            with redis.Redis(port=server.port, socket_timeout=5, decode_responses=True) as r:
                out[server.url] = sorted(r.keys(pattern))
        return out
