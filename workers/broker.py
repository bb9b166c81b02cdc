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
held back by the prefetch it waits for the acknowledgement that frees a place (the pool's
result thread acknowledges a finished task) and looks again at once: a pool of short tasks is
fed as each ends, and a pool of long ones (a check runs for seconds) costs no looks meanwhile.
A first version polled after 2 ms doubling to 20 ms instead: a 9 ms sync then waited 4 to 7 ms
for the consumer's next look, and a one-process worker sat idle 45% of the time.

Each look also listed and sorted the whole folder, once for every queue the worker consumes:
with 1,000 first syncs waiting (and the messages they send), the consumer spent 5.5 s of CPU
listing folders, on the two cores the pool needed. The channel keeps what one listing found,
queue by queue in the order kombu reads them (oldest first), and takes the next message of a
queue from there; it lists the folder again when that queue has nothing left: after
`RELIST_AFTER` seconds if it had messages at the last listing, after the polling interval if
it had none. A message another consumer took first is skipped, as kombu skips it.

Messages, folders and acknowledgements are kombu's own: a process with the stock
`filesystem://` transport (a web process that only sends, say) reads the same queues.

Redis (deployed) is an event-driven transport and never polls: this is for the embedded
defaults only (`CELERY_BROKER_TRANSPORT` in the settings).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps, loads

logger = logging.getLogger(__name__)

#: A queue with nothing left in the last listing lists the folder again after this long.
RELIST_AFTER = 0.02
#: kombu names a message `<monotonic ms>_<uuid>.<queue>.msg`.
SUFFIX = ".msg"


def sent_order(name: str) -> tuple[int, str]:
    """Oldest first: by the millisecond a name starts with, as a number. By name alone, a
    message sent as the count gained a digit ("100000_...") came before older ones ("99999_...")."""
    stamp = name.partition("_")[0]
    # ASCII digits only: "²" is a digit to `isdigit`, and `int` refuses it.
    return (int(stamp) if stamp.isascii() and stamp.isdigit() else -1, name)


class FolderChannel(filesystem.Channel):
    """kombu's folder channel, reading messages from its last listing of the folder."""

    connection: FolderTransport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listed: dict[str, deque[str]] = {}
        self._listed_at = float("-inf")
        self._had_messages: set[str] = set()

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        waiting = self._listed.get(queue)
        if not waiting and time.monotonic() - self._listed_at >= self._relist_after(queue):
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
            try:
                return loads(payload.decode())
            except ValueError:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
                # Not a message (cut short by a full disk before `_put` wrote whole files):
                # dropped with a line in the log. Raising it ended the worker, which was
                # started again, to meet the next one.
                logger.error("dropped %s: not a message (%d bytes)", name, len(payload))
                continue
        raise Empty()

    # (kombu's two bases disagree on the signature: this is its folder channel's.)
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        """Put `payload` onto `queue`: written whole under a name no consumer lists, then
        renamed into the queue, so a write that fails (a full disk) leaves nothing in it.
        kombu's own wrote in place, and left an empty message for each failed send."""
        name = f"{int(round(time.monotonic() * 1000))}_{uuid.uuid4()}.{queue}{SUFFIX}"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as handle:
                handle.write(dumps(payload).encode())
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    # A place in the prefetch frees when a message is acknowledged or rejected, or when the
    # prefetch grows (Celery raises it for a task with an ETA): the consumer looks again.
    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        super().basic_ack(delivery_tag, multiple=multiple)
        self.connection.freed.set()

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        super().basic_reject(delivery_tag, requeue=requeue)
        self.connection.freed.set()

    def basic_qos(self, *args: Any, **kwargs: Any) -> None:
        super().basic_qos(*args, **kwargs)
        self.connection.freed.set()

    def _relist_after(self, queue: str) -> float:
        """A queue that had messages at the last listing may have more at once; one that had
        none is looked for at the polling interval, as kombu polls an empty queue. (A worker
        also consumes its remote-control queue, nearly always empty: listing a folder of
        4,000 waiting messages for it every 20 ms took most of the consumer's CPU.)"""
        if queue in self._had_messages:
            return RELIST_AFTER
        return max(RELIST_AFTER, float(self.connection.polling_interval or 0))

    def _relist(self) -> None:
        found: defaultdict[str, deque[str]] = defaultdict(deque)
        for name in sorted(os.listdir(self.data_folder_in), key=sent_order):
            queue = name.partition(".")[2]
            if queue.endswith(SUFFIX):
                found[queue.removesuffix(SUFFIX)].append(name)
        self._listed = dict(found)
        self._had_messages = set(found)
        self._listed_at = time.monotonic()


class FolderTransport(filesystem.Transport):
    """kombu's folder transport; looks again as soon as the prefetch has a place free."""

    Channel = FolderChannel

    #: Overridable in tests: what a poll of empty queues waits with.
    sleep: Callable[[float], None] = staticmethod(time.sleep)

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        #: Set by a channel when a place in its prefetch may have freed (any thread).
        self.freed = threading.Event()

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        assert self.cycle is not None  # set when the transport is made
        started = time.monotonic()
        interval = float(self.polling_interval or 0)
        if timeout and interval > timeout:
            interval = timeout
        while True:
            # Cleared before the look: a place freed during it shows as set below.
            self.freed.clear()
            try:
                self.cycle.get(self._deliver, timeout=timeout)
            except Empty:
                if timeout is not None and time.monotonic() - started >= timeout:
                    raise TimeoutError() from None
                if self.prefetch_full():
                    # Until an acknowledgement frees a place; the interval only bounds it.
                    self.wait_for_place(interval)
                elif not self.freed.is_set():
                    self.sleep(interval)
            else:
                return

    def wait_for_place(self, seconds: float) -> bool:
        """Wait until a place in the prefetch may have freed, at most `seconds`; whether one did."""
        return self.freed.wait(seconds)

    def prefetch_full(self) -> bool:
        """Some consuming channel may take no more messages until it acknowledges one."""
        return any(
            channel._consumers and not channel.qos.can_consume() for channel in self.channels or ()
        )
