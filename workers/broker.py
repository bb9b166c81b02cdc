"""The embedded broker: kombu's folder transport, with a worker that stays busy.

kombu's virtual transports poll. When a `drain_events` finds nothing to deliver they sleep
`polling_interval` (0.1 s here) before they look again, and they find nothing for two
reasons: the queues are empty, or the worker already holds as many unacknowledged messages
as its prefetch allows (`worker_prefetch_multiplier` x concurrency: two). In the second case
the messages wait in the folder while the pool runs out of work: a process that finishes a
15 ms sync then waits up to 100 ms for the consumer to wake and hand it the next one. A
queue of 300 first syncs kept `make run`'s two worker processes idle 69% of the time
(py-spy), and took 15.7 s instead of 4.4.

This transport sleeps the full interval only when the queues are empty. While messages are
held back by the prefetch it looks again after a short wait that doubles up to
`HELD_BACK_MAX`, so a pool of short tasks is fed at once and a pool of long ones (a check
runs for seconds) is not polled more than 50 times a second.

Each look also listed and sorted the whole folder, once for every queue the worker consumes:
with 1,000 first syncs waiting (and the messages they send), the consumer spent 5.5 s of CPU
listing folders, on the two cores the pool needed. The channel keeps what one listing found,
queue by queue in the order kombu reads them (oldest first), and takes the next message of a
queue from there; it lists the folder again when that queue has nothing left, at most every
`RELIST_AFTER` seconds. A message another consumer took first is skipped, as kombu skips it.

Messages, folders and acknowledgements are kombu's own: a process with the stock
`filesystem://` transport (a web process that only sends, say) reads the same queues.

Redis (deployed) is an event-driven transport and never polls: this is for the embedded
defaults only (`CELERY_BROKER_TRANSPORT` in the settings).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import defaultdict, deque
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import loads

#: The first wait while the prefetch holds messages back; doubled up to `HELD_BACK_MAX`.
HELD_BACK_WAIT = 0.002
HELD_BACK_MAX = 0.02
#: A queue with nothing left in the last listing lists the folder again after this long.
RELIST_AFTER = 0.02
#: kombu names a message `<monotonic ms>_<uuid>.<queue>.msg`.
SUFFIX = ".msg"


class FolderChannel(filesystem.Channel):
    """kombu's folder channel, reading messages from its last listing of the folder."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listed: dict[str, deque[str]] = {}
        self._listed_at = float("-inf")

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        waiting = self._listed.get(queue)
        if not waiting and time.monotonic() - self._listed_at >= RELIST_AFTER:
            self._relist()
            waiting = self._listed.get(queue)
        folder = Path(self.data_folder_in)
        into = Path(self.processed_folder if self.store_processed else tempfile.gettempdir())
        while waiting:
            name = waiting.popleft()
            try:
                shutil.move(folder / name, into)
            except OSError:
                continue  # another consumer took it, or it went away
            taken = into / name
            try:
                payload = taken.read_bytes()
                if not self.store_processed:
                    taken.unlink()
            except OSError as err:
                raise ChannelError(f"Cannot read {taken} from the queue") from err
            return loads(payload.decode())
        raise Empty()

    def _relist(self) -> None:
        found: defaultdict[str, deque[str]] = defaultdict(deque)
        for name in sorted(os.listdir(self.data_folder_in)):
            queue = name.partition(".")[2]
            if queue.endswith(SUFFIX):
                found[queue.removesuffix(SUFFIX)].append(name)
        self._listed = dict(found)
        self._listed_at = time.monotonic()


class FolderTransport(filesystem.Transport):
    """kombu's folder transport; polls at once while the prefetch holds messages back."""

    Channel = FolderChannel

    #: Overridable in tests: what a poll waits with.
    sleep: Callable[[float], None] = staticmethod(time.sleep)

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        assert self.cycle is not None  # set when the transport is made
        started = time.monotonic()
        interval = float(self.polling_interval or 0)
        if timeout and interval > timeout:
            interval = timeout
        held_back = HELD_BACK_WAIT
        while True:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
            except Empty:
                if timeout is not None and time.monotonic() - started >= timeout:
                    raise TimeoutError() from None
                if self.prefetch_full():
                    self.sleep(min(held_back, HELD_BACK_MAX, interval))
                    held_back *= 2
                else:
                    self.sleep(interval)
                    held_back = HELD_BACK_WAIT
            else:
                return

    def prefetch_full(self) -> bool:
        """Some consuming channel may take no more messages until it acknowledges one."""
        return any(
            channel._consumers and not channel.qos.can_consume() for channel in self.channels or ()
        )
