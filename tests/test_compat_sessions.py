"""Spec of a mended petals 2.2 behaviour (``monitor.compat``): closing a server session.

petals closes a session's stream in ``__del__`` by waiting on hivemind's ``RemoteExpertWorker``
thread; when the cycle collector runs that finalizer *on* the worker thread, the thread waited on
itself forever and every chat in the process stopped. Real petals and hivemind objects; the
collector's timing is reproduced by closing from a coroutine on the worker's own loop.
"""

from __future__ import annotations

import asyncio

import pytest

from monitor import compat

compat.import_petals()
from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker  # noqa: E402
from petals.client.inference_session import _ServerInferenceSession  # noqa: E402


class _Inputs:
    def __init__(self, error=None):
        self.error, self.put_requests = error, []

    async def put(self, request):
        if self.error is not None:
            raise self.error
        self.put_requests.append(request)


async def _ended_stream():
    return
    yield  # (an async generator that ends at once: the server ended the session)


def session(*, stepped: bool, inputs: _Inputs) -> _ServerInferenceSession:
    made = _ServerInferenceSession.__new__(_ServerInferenceSession)
    made._outputs_stream, made._inputs_queue, made.stepped, made.closed = _ended_stream(), inputs, stepped, False
    return made


def test_a_session_closed_on_the_workers_own_thread_does_not_wait_on_itself():
    inputs = _Inputs()
    closing = session(stepped=True, inputs=inputs)

    async def as_the_collector_would():  # a finalizer run on the worker's thread, inside its loop
        closing.close()
        await asyncio.sleep(0.05)  # the scheduled close runs on the loop meanwhile

    RemoteExpertWorker.run_coroutine(as_the_collector_would(), return_future=True).result(timeout=10)
    assert closing.closed and closing._outputs_stream is None
    assert len(inputs.put_requests) == 1  # the end-of-session request was still sent to the server


def test_a_session_whose_server_is_gone_is_closed_for_good():
    broken = session(stepped=True, inputs=_Inputs(BrokenPipeError("the server is gone")))
    with pytest.raises(BrokenPipeError):
        broken.close()
    assert broken.closed and broken._outputs_stream is None
    broken.close()  # (and again, as __del__ will: nothing left to do)
    broken.__del__()
