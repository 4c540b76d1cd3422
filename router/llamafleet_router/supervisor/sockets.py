"""The sockets of a gateway pod with several workers.

The client port: every worker binds and listens on it with its own SO_REUSEPORT socket, and the kernel
spreads new connections over the listening ones by a hash of the connection. The alternative, one
socket bound by the supervisor and inherited, lets whichever worker wakes first accept, and both
uvloop and asyncio accept every pending connection in one go: a burst of connections (a client
opening its pool) would land on one worker. With SO_REUSEPORT a worker only receives connections once
it listens, i.e. once its app has started, and a dead worker's socket leaves the group at once.

The supervisor holds one more socket on the port, bound with SO_REUSEPORT but never listening: it
turns port 0 into a real port before any worker starts, fails a port conflict at once, and keeps the
port while a worker restarts. A socket that does not listen is never given connections, and the
kernel lets only sockets of the same user join the port.

A worker's private metrics port: a loopback socket that the supervisor binds to port 0 and the worker
inherits, so the supervisor knows the port without a race (a port chosen, freed and handed over can
be taken in between) and a dead worker's port refuses at once (the supervisor keeps no copy).
"""

from __future__ import annotations

import socket


def bound_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to `host:port`, not listening yet (uvicorn listens when it serves it)."""
    family, _type, _proto, _name, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def shared_port_socket(host: str, port: int) -> socket.socket:
    """A socket on the client port that the other workers (and the supervisor) share."""
    return bound_socket(host, port, reuse_port=True)


def loopback_socket() -> socket.socket:
    """A socket on a free loopback port, for a worker to inherit (`pass_fds`)."""
    return bound_socket("127.0.0.1", 0)


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])
