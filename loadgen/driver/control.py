"""The control channel between the coordinator and a worker: JSON lines over one TCP connection.

The same channel serves worker processes on this host and Ray actors on other hosts (Ray places and
watches the actors; the run's own coordination is this small protocol):

    worker → coordinator   {"hello": ID, "token": T, "pid": P, "host_sha256": H, "node_ip": IP}
    coordinator → worker   {"options": RunOptions as JSON, "workers": N, "report_s": R}
                                                   (report_s only when it shows a progress line)
    worker → coordinator   {"ping": t0}            (repeated: the clock-offset measurement)
    coordinator → worker   {"pong": tc}
    worker → coordinator   {"ready": true, "offset_ns": O, "uncertainty_ns": U}
    coordinator → worker   {"start_ns": S}         (the shared start, on the coordinator's clock)
    coordinator → worker   {"stop": REASON}        (at any time: stop, record the rest, close the shard)
    worker → coordinator   {"progress": COUNTS}    (every R s from the start, and once at the end, when
                                                   asked: sent, in_flight, done, errors, p99_ttft_ns)
    worker → coordinator   {"error": MESSAGE}      (a one-line error that stopped the worker)

Clock: ``time.time_ns`` (the realtime clock every process and host shares, up to its offset). A worker
measures its offset to the coordinator with ping-pong rounds and keeps the round with the shortest round
trip: offset = (t0 + t1) / 2 − tc, uncertain by half that round trip.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ["PING_ROUNDS", "TOKEN_ENV", "Channel", "measure_offset"]

#: Ping-pong rounds per offset measurement (the shortest round trip wins).
PING_ROUNDS = 16
#: The shared secret a worker presents in its hello (in the environment, not on a command line).
TOKEN_ENV = "LOADGEN_WORKER_TOKEN"
#: Longest message accepted (the run options carry per-request headers).
MAX_MESSAGE_BYTES = 64 << 20


class Channel:
    """JSON messages, one per line, over a byte stream."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)
        self.lock = anyio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        async with self.lock:
            await self.stream.send(data)

    async def receive(self) -> dict[str, Any] | None:
        """The next message; None when the other side closed (or the connection broke)."""
        try:
            line = await self.reader.receive_until(b"\n", MAX_MESSAGE_BYTES)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return None
        value = json.loads(line)
        return value if isinstance(value, dict) else None

    async def try_send(self, message: dict[str, Any]) -> bool:
        """Send when the connection is still up; False when it is not."""
        try:
            with anyio.move_on_after(5):
                await self.send(message)
                return True
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        return False

    async def aclose(self) -> None:
        await self.stream.aclose()


async def measure_offset(channel: Channel, rounds: int = PING_ROUNDS) -> tuple[int, int]:
    """(this clock − the coordinator's clock, its uncertainty), both ns, from ping-pong rounds."""
    best: tuple[int, int] | None = None
    for _ in range(rounds):
        t0 = time.time_ns()
        await channel.send({"ping": t0})
        reply = await channel.receive()
        t1 = time.time_ns()
        if reply is None or "pong" not in reply:
            raise ConnectionError("the coordinator closed the control channel during the clock measurement")
        rtt = t1 - t0
        if best is None or rtt < best[1]:
            best = ((t0 + t1) // 2 - int(reply["pong"]), rtt)
    assert best is not None
    return best[0], best[1] // 2
