"""The prefill gate: with LoRA on, a generation asking for prompt log-probabilities enters an empty
engine and nothing enters after it until its first output; the others share; arrival order."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from lmi_server.prefill_gate import PrefillGate, install


async def _settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_shared_holders_run_together_and_an_exclusive_one_waits_for_them():
    async def scenario():
        gate = PrefillGate()
        order: list[str] = []
        release = {name: asyncio.Event() for name in ("a", "b", "x")}
        first_output = asyncio.Event()

        async def shared(name):
            async with gate.hold(False):
                order.append(f"{name} in")
                await release[name].wait()
            order.append(f"{name} out")

        async def exclusive():
            async with gate.hold(True) as hold:
                order.append("x in")
                assert gate.running == 1
                await first_output.wait()
                hold.started()
                order.append("x started")
                await release["x"].wait()
            order.append("x out")

        a = asyncio.create_task(shared("a"))
        await _settle()
        x = asyncio.create_task(exclusive())
        await _settle()
        b = asyncio.create_task(shared("b"))  # arrives after x: waits behind it
        await _settle()
        assert order == ["a in"] and gate.waiting == 2
        release["a"].set()
        await _settle()
        assert order == ["a in", "a out", "x in"]
        first_output.set()
        await _settle()
        assert order[-2:] == ["x started", "b in"]  # b enters while x decodes
        release["b"].set()
        release["x"].set()
        await asyncio.gather(a, b, x)
        assert gate.running == 0 and gate.waiting == 0 and gate.exclusive_served == 1

    asyncio.run(scenario())


def test_waiters_are_served_in_arrival_order():
    async def scenario():
        gate = PrefillGate()
        entered: list[str] = []

        async def run(name, exclusive):
            async with gate.hold(exclusive) as hold:
                entered.append(name)
                await asyncio.sleep(0.01)
                hold.started()
                await asyncio.sleep(0.01)

        tasks = []
        for name, exclusive in [("s1", False), ("x1", True), ("s2", False), ("x2", True), ("s3", False)]:
            tasks.append(asyncio.create_task(run(name, exclusive)))
            await _settle()
        await asyncio.gather(*tasks)
        assert entered == ["s1", "x1", "s2", "x2", "s3"]

    asyncio.run(scenario())


def test_a_cancelled_waiter_or_holder_leaves_nothing_behind():
    async def scenario():
        gate = PrefillGate()
        stop = asyncio.Event()

        async def hold(exclusive):
            async with gate.hold(exclusive):
                await stop.wait()

        running = asyncio.create_task(hold(False))
        await _settle()
        waiting_exclusive = asyncio.create_task(hold(True))
        waiting_shared = asyncio.create_task(hold(False))
        await _settle()
        assert gate.waiting == 2
        waiting_exclusive.cancel()
        await _settle()
        assert gate.waiting == 0 and gate.running == 2  # the shared one behind it went in
        running.cancel()
        waiting_shared.cancel()
        await asyncio.gather(running, waiting_exclusive, waiting_shared, return_exceptions=True)
        assert gate.running == 0 and gate.waiting == 0
        async with gate.hold(True):  # free again
            assert gate.running == 1

    asyncio.run(scenario())


class FakeEngine:
    def __init__(self):
        self.calls = []
        self.errored = False

    async def generate(self, prompt, sampling_params, request_id, *args, **kwargs):
        self.calls.append((prompt, request_id, kwargs))
        for i in range(3):
            await asyncio.sleep(0)
            yield f"{request_id}-{i}"


def test_the_gated_engine_passes_generate_through_with_its_arguments():
    async def scenario():
        engine = FakeEngine()
        gate = PrefillGate()
        assert install(engine, gate)
        plain = SimpleNamespace(prompt_logprobs=None)
        with_prompt_lps = SimpleNamespace(prompt_logprobs=0)
        out = [o async for o in engine.generate("p", plain, "r1", lora_request=None)]
        assert out == ["r1-0", "r1-1", "r1-2"] and engine.calls[0][2] == {"lora_request": None}
        assert gate.exclusive_served == 0
        # by keyword, as a serving object may call it
        assert [o async for o in engine.generate(prompt="p", sampling_params=with_prompt_lps, request_id="r2")][-1] == "r2-2"
        assert gate.exclusive_served == 1 and gate.running == 0

    asyncio.run(scenario())


def test_a_generator_closed_early_releases_its_place():
    async def scenario():
        gate = PrefillGate()
        engine = FakeEngine()
        install(engine, gate)
        gen = engine.generate("p", SimpleNamespace(prompt_logprobs=1), "r")
        assert await gen.__anext__() == "r-0"
        assert gate.running == 1
        await gen.aclose()
        assert gate.running == 0

    asyncio.run(scenario())


def test_every_caller_of_the_engine_passes_the_gate_once():
    """Whatever holds the engine (a serving object of any front door, a door added later) calls
    the gated generate: the gate sits in the engine object, not in a list of serving objects."""

    async def scenario():
        engine = FakeEngine()
        gate = PrefillGate()
        assert install(engine, gate) is True
        assert install(engine, PrefillGate()) is False  # already gated: never twice
        responses_like = SimpleNamespace(engine_client=engine)  # holds the engine itself
        exclusive = responses_like.engine_client.generate("p", SimpleNamespace(prompt_logprobs=0), "x")
        assert await exclusive.__anext__() == "x-0"
        other = asyncio.create_task(anext(engine.generate("p", SimpleNamespace(prompt_logprobs=None), "y")))
        await _settle()
        # the exclusive one has started: the other is let in after its first output
        assert other.done() and other.result() == "y-0"
        await exclusive.aclose()
        assert gate.exclusive_served == 1

    asyncio.run(scenario())
