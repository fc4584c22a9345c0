"""Helpers the benchmark scripts share (imported as `from netutil import free_port`: a script run
as `python3 scripts/NAME.py` has scripts/ on its import path)."""
import socket


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
