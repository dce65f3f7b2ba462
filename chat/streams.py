"""The chat's one way to hand what worker threads make to the thread that answers the request.

petals' client blocks while a step runs, so an answer is computed on a worker thread (a session's
decoding loop; a batch's groups side by side) while the request's thread streams it. A
``ThreadStream`` runs its producers, each on a thread of its own, and yields what they emit, in
order per producer, until every producer is done; a producer's failure is raised in the consumer
(through ``as_error``), and a producer that emits nothing for ``stall_timeout`` seconds makes the
consumer raise ``on_stall()``. ``close`` tells the producers to stop (``cancelled``) and waits for
them a bounded time.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

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
