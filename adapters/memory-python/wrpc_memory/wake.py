"""Wake-ups between export calls of one instance.

Each export call is a Component Model task with its own asyncio context, and componentize-py
runs a task's Python callbacks only when that task gets an event from the host: an
`asyncio.Event` set by one call and awaited in another does not work (tried with 0.25.1: the
component traps). A waiter here parks on the readable end of a fresh stream
instead, and a wake-up drops the writable end: the host tells the waiting task, whichever call
did it.
"""

import wit_world


class Notify:
    """A signal that can fire many times; `wait` resolves on the first `notify` after it began."""

    def __init__(self) -> None:
        """A signal nobody waits on yet."""
        self._writers: list = []

    def notify(self) -> None:
        """Wake every task waiting now."""
        writers, self._writers = self._writers, []
        for writer in writers:
            writer.__exit__(None, None, None)

    async def wait(self) -> None:
        """Resolve on the next `notify`."""
        writer, reader = wit_world.list_u8_stream()
        self._writers.append(writer)
        with reader:
            await reader.read(1)


class Latch:
    """A signal that is set once and stays set; every `wait`, before or after, resolves."""

    def __init__(self) -> None:
        """A latch that is not set."""
        self._set = False
        self._notify = Notify()

    def set(self) -> None:
        """Set the latch and wake every waiter; setting it again does nothing."""
        if not self._set:
            self._set = True
            self._notify.notify()

    def is_set(self) -> bool:
        """Whether the latch is set."""
        return self._set

    async def wait(self) -> None:
        """Resolve once the latch is set."""
        while not self._set:
            await self._notify.wait()
