"""The placement index: every host's resources and usage, kept in memory per scheduler
instance and refreshed by generation. One light query per placement reads
(name, generation, layout_rev, state, heartbeat) of all hosts; only hosts whose
generation moved have their usage re-read, only hosts whose layout changed are re-parsed.
The DB stays the truth: a claim re-checks the host row inside its transaction."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.db.models import Host
from scheduler.fit import HostView
from scheduler.repo.hosts import host_res
from scheduler.resources import HostRes, Usage


@dataclass
class _Entry:
    generation: int
    layout_rev: int
    state: str
    view: HostView


class HostCache:
    def __init__(self, *, heartbeat_timeout_s: float):
        self.timeout = heartbeat_timeout_s
        self._lock = threading.Lock()
        self._res: dict[str, tuple[int, HostRes]] = {}
        self._entries: dict[str, _Entry] = {}

    def views(self, session: Session, *, now: float) -> list[HostView]:
        rows = session.execute(select(Host.name, Host.generation, Host.layout_rev, Host.admin_state,
                                      Host.last_heartbeat)).all()
        with self._lock:
            entries = dict(self._entries)
            res = dict(self._res)
        stale_usage, stale_res = [], []
        for name, gen, rev, _st, _hb in rows:
            e = entries.get(name)
            if e is None or e.generation != gen:
                stale_usage.append(name)
            if name not in res or res[name][0] != rev:
                stale_res.append(name)
        for chunk in _chunks(stale_res, 500):
            for h in session.scalars(select(Host).where(Host.name.in_(chunk))):
                res[h.name] = (h.layout_rev, host_res(h))
        usages: dict[str, tuple[int, Usage]] = {}
        for chunk in _chunks(stale_usage, 500):
            for name, gen, u in session.execute(select(Host.name, Host.generation, Host.usage)
                                                .where(Host.name.in_(chunk))):
                usages[name] = (gen, Usage.from_dict(u))
        out: list[HostView] = []
        fresh: dict[str, _Entry] = {}
        for name, gen, rev, admin, hb in rows:
            state = "down" if now - hb > self.timeout else admin
            e = entries.get(name)
            if name in usages:
                gen, usage = usages[name]
            elif e is not None:
                usage = e.view.usage
            else:  # deleted and re-added between the two queries: skip this round
                continue
            if e is None or e.generation != gen or e.state != state or e.layout_rev != res[name][0]:
                e = _Entry(gen, res[name][0], state, HostView(res[name][1], usage, state == "active", state))
            fresh[name] = e
            out.append(e.view)
        with self._lock:
            self._entries = fresh
            self._res = {k: v for k, v in res.items() if k in fresh}
        return out

    def res(self, session: Session, host: Host) -> HostRes:
        with self._lock:
            got = self._res.get(host.name)
        if got and got[0] == host.layout_rev:
            return got[1]
        r = host_res(host)
        with self._lock:
            self._res[host.name] = (host.layout_rev, r)
        return r


def _chunks(xs: list[str], n: int):  # type: ignore[no-untyped-def]
    for i in range(0, len(xs), n):
        yield xs[i:i + n]
