"""The client's call socket, watched: a server that goes away mid-call costs
the call nothing, not its deadline.

A DEALER's request to a server that exits (SIGTERM, SIGKILL, a crash) is
lost with the connection, and the reply it waits for never comes: before
this, the engine's step that made the call waited out the whole deadline
(1 s by default; issue 41 measured a stopped server at 0.27x of an engine's
speed). zmq sees the connection close at once (the kernel closes it for a
dead process); a socket monitor turns that into an event the wait polls
beside the reply, so the call fails as soon as the peer is gone. A server
that is there but hung still costs one deadline (nothing tells it from a
slow one), then the breaker refuses calls without sending them.

Disconnect events left from before a send are dropped first: a send only
goes out on a live connection (``ZMQ_IMMEDIATE``), so an older event is
about a connection the request did not use. The io thread delivers events
asynchronously, so one about a connection that died just before the send
can still arrive after the drain; that call then fails once (a miss, the
breaker probes and closes again), never waits.
"""

from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import parse_monitor_message

REPLY, TIMEOUT, GONE = "reply", "timeout", "gone"


class Link:
    """A connected DEALER and a monitor of its connection's end."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self._mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._mon, zmq.POLLIN)

    def forget(self) -> None:
        """Drops the disconnects seen so far (before a send)."""
        while self._mon.poll(0):
            self._mon.recv_multipart()

    def wait(self, deadline: float) -> str:
        """REPLY when a frame is there to read, GONE when the connection
        closed with none, TIMEOUT when the monotonic `deadline` passed."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return REPLY if self.sock.poll(0) else TIMEOUT
            ready = dict(self._poller.poll(int(left * 1000) + 1))
            if self.sock in ready:
                return REPLY  # a reply that came before the close is still an answer
            if self._mon in ready:
                event = parse_monitor_message(self._mon.recv_multipart())["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    return GONE

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._mon.close(0)
        self.sock.close(0)

