#!/usr/bin/env python3
"""Another language calls the C API: Python's ctypes loads the installed
libmooncake_kv_events.so.0, creates a publisher and publishes one `stored` event, which a pyzmq
SUB socket receives and msgpack-python (not the library's encoder) decodes.

Usage: ctypes_test.py <installed library file>
"""

import ctypes
import os
import sys
import time

import msgpack
import zmq
import zmq.utils.monitor


class Config(ctypes.Structure):
    """kv_events_config of mooncake/kv_events_c.h, field for field."""

    _fields_ = [
        ("enable_kv_events", ctypes.c_bool),
        ("bind_endpoint", ctypes.c_char_p),
        ("backend_id", ctypes.c_char_p),
        ("model_name", ctypes.c_char_p),
        ("block_size", ctypes.c_uint32),
        ("additional_salt", ctypes.c_char_p),
        ("lora_name", ctypes.c_char_p),
        ("dp_rank", ctypes.c_uint32),
        ("emit_object_key", ctypes.c_bool),
        ("emit_legacy_compat", ctypes.c_bool),
        ("queue_capacity", ctypes.c_uint32),
        ("curve_secret_key_file", ctypes.c_char_p),
        ("curve_allow", ctypes.c_char_p),
        ("null_allow_addresses", ctypes.c_char_p),
        ("ipc_mode", ctypes.c_char_p),
        ("handshake_timeout_ms", ctypes.c_uint32),
        ("max_connections", ctypes.c_uint32),
        ("max_connections_per_address", ctypes.c_uint32),
        ("send_hwm", ctypes.c_uint32),
        ("replay_endpoint", ctypes.c_char_p),
        ("replay_buffer_bytes", ctypes.c_uint64),
        ("topic", ctypes.c_char_p),
        ("replay_topic_frame", ctypes.c_bool),
        ("heartbeat_ms", ctypes.c_uint32),
        ("snapshot_max_requesters", ctypes.c_uint32),
        ("reannounce_remaining", ctypes.c_bool),
        ("non_utf8", ctypes.c_char_p),
    ]


def load(path):
    lib = ctypes.CDLL(path)
    lib.kv_events_config_init.argtypes = [ctypes.POINTER(Config), ctypes.c_size_t]
    lib.kv_events_create.argtypes = [
        ctypes.POINTER(Config),
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.kv_events_create.restype = ctypes.c_int
    lib.kv_events_on_put_commit.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_uint8,
    ]
    lib.kv_events_on_put_commit.restype = ctypes.c_int
    lib.kv_events_flush.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    lib.kv_events_flush.restype = ctypes.c_int
    lib.kv_events_destroy.argtypes = [ctypes.c_void_p]
    lib.kv_events_destroy.restype = None
    return lib


def main():
    lib = load(sys.argv[1])
    endpoint = f"ipc:///tmp/kvev-ctypes-{os.getpid()}.sock"

    config = Config()
    lib.kv_events_config_init(ctypes.byref(config), ctypes.sizeof(config))
    # The last fields of the list, with their defaults: the struct above is the header's.
    assert config.non_utf8 == b"skip" and not config.reannounce_remaining, config.non_utf8
    config.enable_kv_events = True
    config.bind_endpoint = endpoint.encode()
    config.backend_id = b"python-store"
    publisher = ctypes.c_void_p()
    error = ctypes.create_string_buffer(512)
    status = lib.kv_events_create(
        ctypes.byref(config), ctypes.sizeof(config), ctypes.byref(publisher), error, len(error)
    )
    assert status == 0, f"kv_events_create: {status} {error.value!r}"

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    assert monitor.poll(10000), "no handshake with the publisher"
    zmq.utils.monitor.recv_monitor_message(monitor)
    # The subscription crosses to the PUB socket after the handshake (ZeroMQ's slow joiner).
    time.sleep(0.2)

    key = b"py-key"
    assert lib.kv_events_on_put_commit(publisher, b"tenant-p", 8, key, len(key), b"g", 1, 1) == 0
    assert lib.kv_events_flush(publisher, 10000) == 0, "flush"
    assert sub.poll(10000), "no message arrived"
    topic, sequence, payload = sub.recv_multipart()
    timestamp, events, dp_rank = msgpack.unpackb(payload, raw=False)
    assert topic == b"" and int.from_bytes(sequence, "big") == 0, (topic, sequence)
    assert len(events) == 1, events
    event = events[0]
    expected = {
        "event_type": "stored",
        "medium": "cpu",
        "object_key": "py-key",
        "tenant_id": "tenant-p",
        "group_id": "g",
        "backend_id": "python-store",
    }
    for field, value in expected.items():
        assert event[field] == value, (field, event)
    assert event["timestamp"] == timestamp and dp_rank == 0

    lib.kv_events_destroy(publisher)
    monitor.close()
    sub.close()
    context.term()
    print("ctypes_test: Python published one stored event through the installed library")


if __name__ == "__main__":
    main()
