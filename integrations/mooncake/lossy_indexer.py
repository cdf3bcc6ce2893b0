#!/usr/bin/env python3
"""The project's example indexer (examples/python/indexer.py) with a small receive high-water
mark on its SUB socket, for the soak: on SIGUSR1 it stops reading for PAUSE seconds while its
ZeroMQ I/O thread goes on receiving, so that its SUB socket drops what exceeds RCVHWM, as a
busy indexer's would; it must get back to the master's state by replay or snapshot like any
indexer.

    lossy_indexer.py INDEXER_PY RCVHWM PAUSE [indexer.py arguments...]

Only the SUB socket's RCVHWM is changed: the DEALER that carries replays and snapshots keeps
its own, so that what heals the loss is not lost in turn. (A SIGSTOP would stop the I/O thread
too, and the kernel's socket buffers, megabytes on loopback, would hold what it did not read.)
"""

import importlib.util
import signal
import sys
import time

import zmq


def main():
    path, hwm, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    # The handler runs in the main thread, between two reads of the indexer's loop.
    signal.signal(signal.SIGUSR1, lambda *_: time.sleep(pause))
    spec = importlib.util.spec_from_file_location("indexer", path)
    indexer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(indexer)

    class Socket(zmq.Socket):
        def setsockopt(self, option, value):
            if option == zmq.RCVHWM and self.type == zmq.SUB:
                value = hwm
            return super().setsockopt(option, value)

    class Context(zmq.Context):
        _socket_class = Socket

    # The indexer (the mooncake_kv_events package) makes its context with zmq.Context().
    zmq.Context = Context
    indexer.main(sys.argv[4:])


if __name__ == "__main__":
    main()
