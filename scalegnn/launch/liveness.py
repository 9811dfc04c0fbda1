"""Which ranks of a launched job are still alive: heartbeats in the rendezvous store.

A collective that fails says little about why: gloo reports a timeout or a closed
connection, NCCL a watchdog timeout, and none names the rank that went away. Across
nodes the reason that matters is usually a node: its processes killed, its link cut,
the node drained. So every rank of a job a launcher started (torchrun, srun, submitit,
Flux) keeps a counter in the job's rendezvous store (rank 0's TCP store) moving from a
thread of its own, and marks the store before it exits on purpose. When a run fails,
a rank asks the store which counters stood still for :data:`STALL_S` without an exit
mark: those ranks are lost, and the record names them with their hosts
(:func:`scalegnn.session.name_lost_ranks`).

From a rank that cannot reach the store at all (its own link cut, or rank 0's node
gone), the lost ones are the ranks on the store's host, as far as it can tell:
the survey says so, naming the host it could not reach.

The counter thread talks through a store client of its own (a second TCP connection
to the same store), so it never waits on a lock the training thread holds. A store
behind a cut link does not fail an ``add`` or ``set``: the call waits on its socket
for good (the store's timeout bounds waiting for keys, not a silent peer). So every
call the survey and the exit mark make runs under a deadline of its own
(:func:`_within`), on a daemon thread that may stay stuck as the process exits.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time

__all__ = ["Liveness", "HEARTBEAT_S", "STALL_S"]

log = logging.getLogger("scalegnn.launch")

HEARTBEAT_S = 1.0  # how often each rank moves its counter
# A rank is lost when its counter stood still this long: a few beats, so that a rank whose
# thread waits for the GIL behind a long Python step on a busy node is not named.
STALL_S = 5.0
STORE_DEADLINE_S = 5.0  # one store call of the survey or the exit mark; past it, the store is unreachable
_STORE_TIMEOUT = datetime.timedelta(seconds=STORE_DEADLINE_S)  # connecting, and waiting for a key
_PREFIX = "scalegnn/liveness"


class Liveness:
    """Heartbeats of one rank of a job, and the survey of who is lost.

    ``addr``, ``port``: the job's rendezvous store (the ``MASTER_ADDR``/``MASTER_PORT``
    that ``torch.distributed`` started from); ``placement``: every rank's
    ``{"rank", "host", ...}`` (:func:`scalegnn.launch.environment.gather_placement`);
    ``key``: what tells this run's counters from an earlier attempt's in the same store
    (the run id)."""

    def __init__(self, addr: str, port: int, rank: int, placement: list[dict], key: str):
        self.addr, self.port, self.rank, self.placement = addr, port, rank, placement
        self.prefix = f"{_PREFIX}/{key}"
        self._stop = threading.Event()
        self._unreachable = False  # the survey found the store gone: the exit mark would only wait
        self._thread: threading.Thread | None = None
        self._store = None

    # ------------------------------------------------------------------ this rank's side
    def start(self) -> Liveness:
        import torch.distributed as dist

        try:
            self._store = dist.TCPStore(self.addr, self.port, is_master=False, timeout=_STORE_TIMEOUT,
                                        wait_for_workers=False)
        except Exception as exc:  # noqa: BLE001 - a run without heartbeats still runs; its failures name no host
            log.warning("liveness: no connection to the rendezvous store %s:%s (%s): a failed run will not name "
                        "lost ranks", self.addr, self.port, exc)
            return self
        self._beat()
        self._thread = threading.Thread(target=self._run, name="scalegnn-liveness", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        self._store.add(f"{self.prefix}/beat/{self.rank}", 1)

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - the store is gone (rank 0 exited, a link cut): nothing to beat to
                return

    def stop(self, reason: str) -> None:
        """Stop beating and say why (a rank that stops on purpose is not lost)."""
        self._stop.set()
        if self._unreachable:
            return
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_S * 3)
        if self._store is not None:
            try:
                _within(STORE_DEADLINE_S, self._store.set, f"{self.prefix}/exit/{self.rank}", reason)
            except Exception:  # noqa: BLE001 - unreachable store: the survey of the others names this rank's host
                pass

    # ------------------------------------------------------------------ the survey
    def survey(self) -> dict | None:
        """Who is lost, as the record says it: ``{"ranks": [{"rank", "host"}...], "how": text}``;
        None when every rank is alive or left on purpose (or nothing can be told).
        Takes about :data:`STALL_S` (two readings of every counter)."""
        if self._store is None:
            return None
        ranks = [p["rank"] for p in self.placement]
        try:
            first = _within(STORE_DEADLINE_S, self._counts, ranks)
            time.sleep(STALL_S)
            second = _within(STORE_DEADLINE_S, self._counts, ranks)
            exited = _within(STORE_DEADLINE_S, self._exited, ranks)
        except Exception:  # noqa: BLE001 - the store does not answer: its host is what this rank lost
            self._unreachable = True
            store_host = self.placement[0]["host"]
            lost = [p for p in self.placement if p["host"] == store_host]
            return {"ranks": [_who(p) for p in lost],
                    "how": f"the rendezvous store on {store_host} ({self.addr}:{self.port}) does not answer"}
        stalled = [p for p in self.placement
                   if p["rank"] != self.rank and first[p["rank"]] == second[p["rank"]] and p["rank"] not in exited]
        if not stalled:
            return None
        return {"ranks": [_who(p) for p in stalled], "how": f"no heartbeat for {STALL_S:.0f} s"}

    def _counts(self, ranks) -> dict[int, int]:
        # add(key, 0) reads a counter without waiting for it to exist (get() would wait).
        return {r: self._store.add(f"{self.prefix}/beat/{r}", 0) for r in ranks}

    def _exited(self, ranks) -> set[int]:
        return {r for r in ranks if self._store.check([f"{self.prefix}/exit/{r}"])}


def _within(seconds: float, fn, *args):
    """``fn(*args)``, or ``TimeoutError`` when it has not returned after ``seconds`` (it
    goes on, on a daemon thread, until its socket gives up or the process exits)."""
    answer: queue.Queue = queue.Queue(maxsize=1)

    def call():
        try:
            answer.put((True, fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            answer.put((False, exc))

    threading.Thread(target=call, name="scalegnn-liveness-call", daemon=True).start()
    try:
        ok, value = answer.get(timeout=seconds)
    except queue.Empty:
        raise TimeoutError(f"the rendezvous store gave no answer in {seconds:.0f} s") from None
    if not ok:
        raise value
    return value


def _who(entry: dict) -> dict:
    return {"rank": entry["rank"], "host": entry["host"]}

