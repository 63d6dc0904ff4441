"""The examples of the synchronizers' pages run as written, against real masters: each
page's Python blocks, in order, in one namespace that has ``urls`` (and ``mgr``) and
the application's functions the examples call."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redreentrant import LockManager
from redreentrant.testing import LocalEnsemble

DOCS = Path(__file__).resolve().parent.parent / "docs"


def blocks(page: str) -> list[str]:
    text = (DOCS / page).read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


class Inside:
    """How many calls are inside at once, and the most there ever were."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self._lock = threading.Lock()

    def __call__(self, value: Any) -> Any:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.005)
        with self._lock:
            self.now -= 1
        return value


@pytest.fixture
def urls(ensemble: LocalEnsemble) -> list[str]:
    return ensemble.urls[:3]


@pytest.fixture
def mgr(urls: list[str]) -> Iterator[LockManager]:
    with LockManager(urls) as m:
        yield m


def run_page(page: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = dict(names)
    for code in blocks(page):
        exec(compile(code, f"docs/{page}", "exec"), namespace)
    return namespace


def test_semaphore_page(urls: list[str]) -> None:
    partner = Inside()
    ns = run_page("semaphore.md", urls=urls, call_partner=partner)
    assert ns["answers"] == list(range(100))
    assert 1 < partner.most <= 4


def test_multi_lock_page(urls: list[str]) -> None:
    balances = {"alice": 100, "bob": 0}

    def debit(account: str, amount: int) -> None:
        balances[account] -= amount

    def credit(account: str, amount: int) -> None:
        balances[account] += amount

    run_page("multi-lock.md", urls=urls, debit=debit, credit=credit)
    assert balances == {"alice": 90, "bob": 10}


def test_read_write_lock_page(urls: list[str], mgr: LockManager) -> None:
    class Config:
        def __init__(self, version: int) -> None:
            self.version = version

        def migrated(self) -> Config:
            return Config(self.version + 1)

    saved = [Config(1)]
    ns = run_page(
        "read-write-lock.md",
        urls=urls,
        mgr=mgr,
        publish_new_version=lambda: None,
        use_new_version=lambda: None,
        load_config=lambda: saved[-1],
        save_config=saved.append,
        CURRENT=2,
    )
    assert ns["show"]().version == 1
    ns["migrate"]()
    assert ns["show"]().version == 2
    ns["migrate"]()  # current already: nothing to write
    assert len(saved) == 2


def test_leader_election_page(urls: list[str], ensemble: LocalEnsemble) -> None:
    terms: list[int] = []
    ns = run_page("leader-election.md", urls=urls, run_scheduler=terms.append, resource_url=urls[0])
    assert ns["written"] is True and len(terms) == 1
    ensemble.flushall()  # the terms' counters and the store outlive the page
