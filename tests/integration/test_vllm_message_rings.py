"""What shrinking vLLM's message rings relies on: a message larger than a ring's chunk still arrives
whole (vLLM sends it over the queue's socket instead), so a small /dev/shm costs speed on large
messages, never correctness. Against the installed vLLM's own MessageQueue, writer and reader."""

from __future__ import annotations

import threading

from vllm.distributed.device_communicators.shm_broadcast import MessageQueue


def test_a_message_larger_than_a_chunk_arrives_whole():
    writer = MessageQueue(1, 1, max_chunk_bytes=64 * 1024, max_chunks=10)
    got: list[object] = []

    def read() -> None:
        reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
        reader.wait_until_ready()
        got.extend(reader.dequeue(timeout=30) for _ in range(3))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    writer.wait_until_ready()
    big = bytes(range(256)) * 8192  # 2 MiB through 64 KiB chunks
    for message in ({"small": 1}, {"big": big}, {"after": 2}):
        writer.enqueue(message)
    thread.join(60)
    assert got == [{"small": 1}, {"big": big}, {"after": 2}]
