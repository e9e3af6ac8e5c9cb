"""A block that fans its steps out to threads: the call's steps are built once (one book for
every thread), and StepBook.begin's check-then-add is atomic. The interleavings are forced."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from idemkey import Policy, RedisStore, guard
from idemkey.errors import UsageError
from idemkey.guard._steps import StepBook

# How long a thread waits for the other to reach a point the fix makes it unable to reach.
_GRACE = 0.5


def test_first_steps_of_two_threads_share_one_book(real_client: redis.Redis, prefix: str) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix))
    with guard(store, "fanout", payload=1) as call:
        make = call._make_steps
        assert make is not None
        builds: list[object] = []
        second_building = threading.Event()

        def slow_make() -> Any:
            if builds:  # the second thread's build: the unfixed code gets here
                second_building.set()
            else:
                builds.append(None)
                thread.start()
                second_building.wait(_GRACE)  # returns at once without the lock
            steps = make()
            builds.append(steps)
            return steps

        call._make_steps = slow_make
        got: list[object] = []
        thread = threading.Thread(target=lambda: got.append(call._runner()))
        mine = call._runner()
        thread.join(10)
        assert got == [mine]
        assert not second_building.is_set()
        call.save(1)
    store.close()


class _FinishWhileChecked(dict[str, bytes]):
    """The first ``name in book._done`` lets another thread finish the step, then answers what
    it found before: the moment between begin's check and its add."""

    def __init__(self, book: StepBook) -> None:
        super().__init__()
        self.book, self.first = book, True
        self.finished = threading.Event()

    def __contains__(self, key: object) -> bool:
        found = super().__contains__(key)
        if self.first:
            self.first = False
            other = threading.Thread(target=self.book.finish, args=(key, b"\x01r"))
            other.start()
            self.finished.wait(_GRACE)  # at once without the lock; else the finish waits
        return found

    def __setitem__(self, key: str, value: bytes) -> None:
        super().__setitem__(key, value)
        self.finished.set()


def test_begin_does_not_run_a_step_finished_during_its_check() -> None:
    book = StepBook(fence=1)
    assert book.begin("a") is None  # thread 1 runs "a"
    done = _FinishWhileChecked(book)
    book._done = done
    # Thread 2's call.step("a") while thread 1 finishes it: the first result, or UsageError
    # ("already running"), never a second run.
    try:
        result = book.begin("a")
    except UsageError:
        result = b"running"
    assert result is not None, "step 'a' would run a second time"
    deadline = time.monotonic() + 10
    while not done.finished.is_set():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert book.begin("a") == b"\x01r"


def test_same_name_twice_at_once_raises() -> None:
    book = StepBook(fence=1)
    assert book.begin("a") is None
    with pytest.raises(UsageError, match="already running"):
        book.begin("a")
    book.finish("a", b"\x01r")
    assert book.begin("a") == b"\x01r"
