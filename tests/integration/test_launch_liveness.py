"""Which ranks a failed job lost (scalegnn/launch/liveness.py): heartbeats in a real TCP
store, surveyed as a failed run's rank 0 and a cut-off rank survey them."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch.distributed as dist

from scalegnn.launch import liveness
from scalegnn.launch.environment import free_port
from scalegnn.launch.liveness import Liveness
from scalegnn.session import name_lost_ranks

PLACEMENT = [{"rank": 0, "host": "n1", "local_rank": 0, "device": "cpu"},
             {"rank": 1, "host": "n1", "local_rank": 1, "device": "cpu"},
             {"rank": 2, "host": "n2", "local_rank": 0, "device": "cpu"},
             {"rank": 3, "host": "n2", "local_rank": 1, "device": "cpu"}]


@pytest.fixture
def store(monkeypatch):
    """A rendezvous store on this host, as rank 0 of a job holds it; beats every 0.1 s,
    a rank lost after 0.6 s still (the survey's pace, not what it decides)."""
    monkeypatch.setattr(liveness, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(liveness, "STALL_S", 0.6)
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=10),
                           wait_for_workers=False)
    yield port
    del master


def _ranks(port, alive, key="run-a"):
    return {r: Liveness("127.0.0.1", port, r, PLACEMENT, key).start() for r in alive}


def test_ranks_whose_heartbeat_stops_are_named_with_their_hosts(store):
    ranks = _ranks(store, [0, 1, 2, 3])
    try:
        assert ranks[0].survey() is None  # all beat: nobody is lost
        for r in (2, 3):  # the node n2 goes away: its threads stop beating, nothing marks an exit
            ranks[r]._stop.set()
            ranks[r]._thread.join()
        lost = ranks[0].survey()
        assert lost == {"ranks": [{"rank": 2, "host": "n2"}, {"rank": 3, "host": "n2"}],
                        "how": "no heartbeat for 1 s"}
        ranks[1].stop("failed")  # a rank that stops on purpose marks it: not lost
        assert ranks[0].survey()["ranks"] == [{"rank": 2, "host": "n2"}, {"rank": 3, "host": "n2"}]
    finally:
        for r in ranks.values():
            r.stop("test over")


def test_a_rank_that_never_beat_is_lost_and_an_earlier_runs_beats_do_not_count(store):
    old = _ranks(store, [1], key="run-a")  # a previous attempt's rank 1, still beating under its own key
    ranks = _ranks(store, [0], key="run-b")
    try:
        assert ranks[0].survey()["ranks"] == [{"rank": 1, "host": "n1"}, {"rank": 2, "host": "n2"},
                                              {"rank": 3, "host": "n2"}]
    finally:
        for r in (*old.values(), *ranks.values()):
            r.stop("test over")


def test_a_store_that_does_not_answer_names_its_host_within_the_deadline(monkeypatch):
    """A store behind a cut link: the connection stands but no call returns. The survey
    gives up after its deadline and names the ranks on the store's host; the exit
    mark then does not wait on the store again."""
    monkeypatch.setattr(liveness, "STORE_DEADLINE_S", 1.0)
    monkeypatch.setattr(liveness, "STALL_S", 0.2)
    rank = Liveness("10.0.0.1", 29500, 2, PLACEMENT, "run-a")
    rank._store = _SilentStore()
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("lost", rank.survey()))
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "the survey waited on the silent store past its deadline"
    assert done["lost"] == {"ranks": [{"rank": 0, "host": "n1"}, {"rank": 1, "host": "n1"}],
                            "how": "the rendezvous store on n1 (10.0.0.1:29500) does not answer"}
    t = threading.Thread(target=rank.stop, args=("failed",))
    t.start()
    t.join(timeout=0.5)
    assert not t.is_alive()


class _SilentStore:
    """A store client whose every call waits forever, as a TCPStore's does behind a cut link."""

    def add(self, key, value):
        threading.Event().wait()

    set = check = add


def test_the_record_names_the_lost_ranks_first():
    record = {"error": "RuntimeError: Timed out waiting 15000ms for recv operation to complete"}
    name_lost_ranks(record, None)
    assert "lost_ranks" not in record
    name_lost_ranks(record, {"ranks": [{"rank": 2, "host": "n2"}, {"rank": 3, "host": "n2"},
                                       {"rank": 5, "host": "n3"}], "how": "no heartbeat for 5 s"})
    assert record["lost_ranks"][2] == {"rank": 5, "host": "n3"}
    assert record["error"] == ("ranks 2, 3 on n2; rank 5 on n3 lost (no heartbeat for 5 s): "
                               "RuntimeError: Timed out waiting 15000ms for recv operation to complete")
