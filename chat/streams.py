"""The chat's one way to hand what worker threads make to the thread that answers the request.

petals' client blocks while a step runs, so an answer is computed on a worker thread (a session's
decoding loop; a batch's groups side by side) while the request's thread streams it. A
``ThreadStream`` runs its producers, each on a thread of its own, and yields what they emit, in
order per producer, until every producer is done; a producer's failure is raised in the consumer
(through ``as_error``), and a producer that emits nothing for ``stall_timeout`` seconds makes the
consumer raise ``on_stall()``. ``close`` tells the producers to stop (``cancelled``) and waits for
them a bounded time.

``started_waiting`` is the other hand-over: a request that may wait for its slot is started on a
thread of its own, so that the request's thread can tell its client the place it waits in as it
changes (``on_wait``) before it has an answer to stream.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

T = TypeVar("T")

Producer = Callable[[Callable[[Any], None], threading.Event], None]  # (emit, cancelled) -> None
_ITEM, _DONE, _ERROR = "item", "done", "error"


class ThreadStream:
    def __init__(self, producers: Sequence[Producer], *, name: str):
        self.cancelled = threading.Event()
        self._queue: queue.Queue = queue.Queue()
        self._running = len(producers)
        self._threads = [threading.Thread(target=self._run, args=(produce,), name=name, daemon=True)
                         for produce in producers]
        for thread in self._threads:
            thread.start()

    def _run(self, produce: Producer) -> None:
        try:
            produce(lambda item: self._queue.put((_ITEM, item)), self.cancelled)
            self._queue.put((_DONE, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._queue.put((_ERROR, e))

    def items(self, *, stall_timeout: Optional[float] = None, on_stall: Callable[[], BaseException] = TimeoutError,
              as_error: Callable[[BaseException], BaseException] = lambda error: error) -> Iterator[Any]:
        """What the producers emit, until all are done; a producer's failure raised as ``as_error(it)``."""
        while self._running:
            try:
                kind, payload = self._queue.get(timeout=stall_timeout)
            except queue.Empty:
                raise on_stall() from None
            if kind == _DONE:
                self._running -= 1
            elif kind == _ERROR:
                self._running = 0
                raise as_error(payload)
            else:
                yield payload

    def close(self, timeout: float) -> None:
        """Tell the producers to stop, and wait for each at most ``timeout`` seconds."""
        self.cancelled.set()
        for thread in self._threads:
            thread.join(timeout)


def started_waiting(start: Callable[[Callable[[int, float], None]], T], release: Callable[[T], None], *,
                    name: str) -> Iterator[tuple]:
    """Run ``start(on_wait)`` on a thread of its own; yield ``("queued", position, expected wait)``
    each time ``on_wait`` is told, then ``("ready", what start returned)`` and stop; ``start``'s
    failure is raised here. A consumer that leaves before (the generator closed) leaves the result
    to ``release``, whenever it comes."""
    told: "queue.Queue[tuple]" = queue.Queue()
    lock, left = threading.Lock(), threading.Event()

    def run() -> None:
        try:
            result = start(lambda position, wait: told.put(("queued", position, wait)))
        except BaseException as e:  # noqa: BLE001 - raised in the consumer
            told.put(("error", e))
            return
        with lock:
            if left.is_set():  # its client went away while it waited
                release(result)
                return
            told.put(("ready", result))

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        while True:
            item = told.get()
            if item[0] == "error":
                raise item[1]
            yield item
            if item[0] == "ready":
                return
    finally:
        with lock:
            left.set()
        while not told.empty():  # started, but never taken
            late = told.get_nowait()
            if late[0] == "ready":
                release(late[1])
