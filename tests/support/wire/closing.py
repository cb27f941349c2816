"""Whether a server closed a client's socket: at once, or before the test's deadline.

A test of a server's timeout asserts that the server closed the connection (and that it had not
at once), never how long the close took.
"""

from __future__ import annotations

import socket


def still_open(sock: socket.socket) -> bool:
    """Whether the server has not closed `sock`, looking without waiting (what it sent is dropped)."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        while sock.recv(1 << 16):
            pass
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.settimeout(timeout)
    return False


def closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closes `sock` (what it sends is read and dropped) before `deadline`
    seconds pass: a deadline so that the test ends, not a measure of the server."""
    sock.settimeout(deadline)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True
