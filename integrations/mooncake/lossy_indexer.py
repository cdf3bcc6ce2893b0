#!/usr/bin/env python3
"""The project's example indexer (examples/python/indexer.py) with a small receive high-water
mark and a 4 KiB kernel receive buffer on its SUB socket, for the soak (whose master holds at
most kv_events_send_hwm messages for a subscriber that does not read): stopped for seconds (SIGSTOP), it loses messages, and must
get back to the master's state by replay or snapshot like any indexer.

    lossy_indexer.py INDEXER_PY RCVHWM [indexer.py arguments...]

Only the SUB socket's RCVHWM is changed: the DEALER that carries replays and snapshots keeps
its own, so that what heals the loss is not lost in turn.
"""

import importlib.util
import sys

import zmq


def main():
    path, hwm = sys.argv[1], int(sys.argv[2])
    spec = importlib.util.spec_from_file_location("indexer", path)
    indexer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(indexer)

    class Socket(zmq.Socket):
        def setsockopt(self, option, value):
            if option == zmq.RCVHWM and self.type == zmq.SUB:
                value = hwm
                # A small kernel buffer too, or the TCP buffers on both sides would hold what
                # a stopped subscriber does not read (megabytes) and nothing would be lost.
                super().setsockopt(zmq.RCVBUF, 4096)
            return super().setsockopt(option, value)

    class Context(zmq.Context):
        _socket_class = Socket

    indexer.zmq.Context = Context
    indexer.main(sys.argv[3:])


if __name__ == "__main__":
    main()
