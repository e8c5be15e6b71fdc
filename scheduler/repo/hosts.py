"""Host queries. Keyword-only, take the session, never commit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import cache
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Text, bindparam, cast, func, select, text, update
from sqlalchemy.orm import Session

from api.jsonmodel import SchemaError
from api.layout import MAX_CPU, Layout, layout_problems
from api.states import AdminState, HostState, VmStatus
from scheduler.db.models import Host, Vm
from scheduler.errors import BadLayout, HostNotFound, LayoutShrink
from scheduler.repo import lite, pg
from scheduler.repo import pulse as pulse_repo
from scheduler.resources import HostRes, Usage, host_from_layout, label_items, usage_lost


LOOKUP = object()  # ``upsert_host``'s ``known`` when the caller did not read the host's row


def parse_layout(data: dict[str, Any]) -> Layout:
    try:
        return Layout.from_dict(data)
    except (SchemaError, TypeError, KeyError, ValueError) as e:
        raise BadLayout(str(e), field="layout") from e


def check_layout(data: dict[str, Any], siblings: dict[str, list[int]]) -> Layout:
    """A registered layout, checked as a whole (api/layout.py ``layout_problems``): the
    first problem names the field, the message lists up to five."""
    layout = parse_layout(data)
    bad = layout_problems(layout)
    for cpu, sib in siblings.items():
        if not cpu.isdigit() or not all(0 <= s <= MAX_CPU for s in sib):
            bad.append((f"cpu_siblings.{cpu}", "CPU ids are 0-65535"))
    if bad:
        raise BadLayout("; ".join(f"{f}: {r}" for f, r in bad[:5]) + (f" (and {len(bad) - 5} more)"
                                                                      if len(bad) > 5 else ""), field=bad[0][0])
    return layout


def host_res(h: Host | Any, parsed: Layout | None = None) -> HostRes:
    """``h``: a Host, or anything with its layout columns. ``parsed``: ``h.layout`` already
    parsed (a registration's ``check_layout``)."""
    sib = {int(k): tuple(v) for k, v in (h.siblings or {}).items()}
    return host_from_layout(h.name, parsed or parse_layout(h.layout), siblings=sib, min_rate=h.pf_min_rate,
                            disk_classes=h.disk_classes, rack=h.rack, labels=h.labels)


# What a host's pools are built from that hosts of one shape share; read as stored text
_SHAPE_COLUMNS = ("layout", "siblings", "pf_min_rate", "disk_classes")


def res_by_name(*, session: Session, names: Sequence[str]) -> Iterator[tuple[str, str, int, HostRes]]:
    """(name, owner, layout_rev, pools) of the hosts ``names``: the index's pass over the
    fleet. A fleet has few shapes, and hosts of one shape differ only in name, rack and
    labels, so the rows are read as plain columns with the shape's JSON as its stored
    text, and each distinct text is decoded and built once. At 100,000 hosts a replica's
    start spent 9 CPU-s building ORM objects (decoding every host's JSON) and 9 building
    every host's pools; two equal shapes stored as different text are built twice."""
    cols = [Host.name, Host.owner, Host.layout_rev, Host.rack, cast(Host.labels, Text).label("labels"),
            *(cast(getattr(Host, c), Text).label(c) for c in _SHAPE_COLUMNS)]
    shapes: dict[tuple[str | None, ...], HostRes] = {}
    labels: dict[str | None, Any] = {}
    for i in range(0, len(names), 1000):
        for r in session.execute(select(*cols).where(Host.name.in_(names[i:i + 1000]))):
            key = tuple(getattr(r, c) for c in _SHAPE_COLUMNS)
            if (same := shapes.get(key)) is None:
                doc = {c: (None if t is None else json.loads(t)) for c, t in zip(_SHAPE_COLUMNS, key)}
                same = shapes[key] = host_res(SimpleNamespace(name=r.name, rack="", labels=None, **doc))
            if (lab := labels.get(r.labels)) is None:
                lab = labels[r.labels] = label_items(None if r.labels is None else json.loads(r.labels))
            yield r.name, r.owner, r.layout_rev, replace(same, name=r.name, rack=r.rack, labels=lab)


def down_before(*, now: float, heartbeat_timeout_s: float) -> float:
    """When a host counts as down, the one rule: at ``now``, a host whose last recorded
    heartbeat is before this (silent for longer than the heartbeat timeout). In this
    form the indexed queries use it (``silent``, ``quiet``: ``last_heartbeat < ...``)."""
    return now - heartbeat_timeout_s


def is_down(last_heartbeat: float, *, now: float, heartbeat_timeout_s: float) -> bool:
    """``down_before``, for one host's last heartbeat."""
    return last_heartbeat < down_before(now=now, heartbeat_timeout_s=heartbeat_timeout_s)


def effective_state(h: Host | Any, *, now: float, heartbeat_timeout_s: float, pulse: Any = None) -> str:
    """``h``: a Host or a row with its ``name``, ``last_heartbeat`` and ``admin_state``.
    ``pulse`` (``service.pulse.Pulse``): the replicas' shared liveness, newer than the
    recorded ``last_heartbeat`` (written rarely): the host's last beat is the newer."""
    last = h.last_heartbeat if pulse is None else pulse.seen(h.name, h.last_heartbeat)
    if is_down(last, now=now, heartbeat_timeout_s=heartbeat_timeout_s):
        return HostState.DOWN
    return h.admin_state


def get_host(*, session: Session, name: str, lock: bool = False) -> Host:
    if not lock and (h := session.get(Host, name)) is not None:
        return h  # already in this session (no query), or one primary-key read
    q = select(Host).where(Host.name == name)
    if lock and pg.serves(session):
        q = q.with_for_update()
    h = session.scalars(q).one_or_none()
    if h is None:
        raise HostNotFound(f"no host {name!r}", field="name")
    return h


def names_in_state(*, session: Session, state: str) -> list[str]:
    """The names of the hosts in admin state ``state`` (the drain loop's: "draining")."""
    return list(session.scalars(select(Host.name).where(Host.admin_state == state)).all())


def list_hosts(*, session: Session, rack: str | None = None, limit: int | None = None,
               after: str = "") -> Sequence[Host]:
    """By name; ``after`` + ``limit`` page through them (keyset: a page costs the same
    wherever it starts)."""
    q = select(Host).order_by(Host.name)
    if rack is not None:
        q = q.where(Host.rack == rack)
    if after:
        q = q.where(Host.name > after)
    if limit is not None:
        q = q.limit(limit)
    return session.scalars(q).all()


def summary_rows(*, session: Session) -> Sequence[Any]:
    """Per host only what the fleet summary counts (name, layout_rev, usage, admin_state,
    carved_policy, last_heartbeat): loading whole hosts decoded six JSON columns each,
    two thirds of the summary's time; the layout comes from the host cache by revision."""
    return session.execute(select(Host.name, Host.layout_rev, Host.usage, Host.admin_state, Host.carved_policy,
                                  Host.last_heartbeat)).all()


def state_rows(*, session: Session) -> Sequence[Any]:
    """Every host's (name, admin_state, last_heartbeat): what its state is counted from."""
    return session.execute(select(Host.name, Host.admin_state, Host.last_heartbeat)).all()


def upsert_host(*, session: Session, name: str, address: str, rack: str, labels: dict[str, str],
                layout: dict[str, Any], siblings: dict[str, list[int]], pf_min_rate: dict[str, bool],
                disk_classes: dict[str, str], now: float, owner: str = "",
                heartbeat_timeout_s: float = float("inf"), scrape: dict[str, str | None] | None = None,
                parsed: Layout | None = None, known: Any = LOOKUP,
                beat_id: Callable[[], int] | None = None, flush: bool = True,
                seq: Callable[[], int] | None = None) -> tuple[Host, bool]:
    """Register or re-register; returns (host, created). A changed layout bumps
    ``layout_rev`` and the generation; allocations are kept (hostd is the truth), and a
    layout that would take resources from them is refused (LayoutShrink: drain first).
    ``scrape``: metrics_url, hostd_version, carved_policy as registered (None each when
    the hostd did not send it); they describe the host to Prometheus, not to placement,
    so a change bumps nothing. ``parsed``: ``check_layout(layout, siblings)`` already
    done by the caller (outside the write transaction). A batch of registrations
    (``HostService.register_many``) passes what it read for them all at once: ``known``,
    the host's row or None (no such host), and ``beat_id``, where new hosts' ids come
    from (``pulse_repo.BeatIdSource``), ``seq``, the batch's one change stamp, and
    ``flush`` False: its rows are flushed together at its end. Every refusal (LayoutShrink here; a bad layout before) is
    raised before anything is changed."""
    stamp = seq or (lambda: next_seq(session))
    if parsed is None:
        parsed = check_layout(layout, siblings)  # refuse a bad layout before touching anything
    h = session.get(Host, name) if known is LOOKUP else known
    fields = dict(address=address, rack=rack, labels=labels, layout=layout, siblings=siblings,
                  pf_min_rate=pf_min_rate, disk_classes=disk_classes)
    scrape = {k: (scrape or {}).get(k) for k in SCRAPE_FIELDS}
    if h is None:
        h = Host(name=name, beat_id=beat_id() if beat_id is not None else pulse_repo.next_beat_id(session=session),
                 layout_rev=1, usage=Usage().to_dict(), generation=1, admin_state=AdminState.ACTIVE,
                 last_heartbeat=now, created=now, updated=now, seq=stamp(), owner=owner, **fields,
                 **scrape)
        session.add(h)
        if flush:
            session.flush()
        return h, True
    changed = any(getattr(h, k) != v for k, v in fields.items())
    if changed:  # refused before anything is changed
        res = host_from_layout(name, parsed, siblings={int(k): tuple(v) for k, v in siblings.items()},
                               min_rate=pf_min_rate, disk_classes=disk_classes)
        lost = usage_lost(res, Usage.from_dict(h.usage))
        if lost:
            raise LayoutShrink(f"{name}'s running VMs would lose: {'; '.join(lost)} (drain the host first)",
                               field="layout")
    if owner and not h.owner:
        h.owner = owner  # registered before owners were recorded: claimed now
        h.seq = stamp()  # every replica's heartbeat check must see it
    for k, v in scrape.items():
        if getattr(h, k) != v:
            setattr(h, k, v)
    if changed:
        for k, v in fields.items():
            setattr(h, k, v)
        h.layout_rev += 1
        h.generation += 1
        h.seq = stamp()
    elif is_down(h.last_heartbeat, now=now, heartbeat_timeout_s=heartbeat_timeout_s):
        h.seq = stamp()  # back from down: the index must see it
    back_up(session=session, host=h, seq=stamp)
    h.last_heartbeat = now
    h.updated = now
    if flush:
        session.flush()
    return h, False


SCRAPE_FIELDS = ("metrics_url", "hostd_version", "carved_policy")
TARGET_COLUMNS = (Host.name, Host.rack, Host.admin_state, Host.last_heartbeat, Host.metrics_url,
                  Host.hostd_version, Host.carved_policy)


def scrape_targets(*, session: Session) -> Sequence[Any]:
    """Every host with a metrics address, as rows of ``TARGET_COLUMNS``, in name order:
    one SELECT for the whole fleet (Prometheus asks every refresh interval)."""
    return session.execute(select(*TARGET_COLUMNS).where(Host.metrics_url.is_not(None))
                           .order_by(Host.name)).all()


def owner_of(*, session: Session, name: str) -> str | None:
    """The principal that registered ``name`` ("" when unknown); None: no such host. Loads
    the row into the session, so the heartbeat or update that follows reads it no more."""
    h = session.get(Host, name)
    return None if h is None else h.owner


DOWN_FLAG = "host {host} silent since {since}: marked down"  # a flagged VM's reason
_DOWN_FLAG_LIKE = "host % silent since %"  # any host's flag (queries filter by host too)


def mark_down(*, session: Session, hosts: dict[str, float], before: float, now: float) -> dict[str, int]:
    """Mark ``hosts`` down in one statement, those no replica marked yet whose row still
    says they were silent since before ``before`` (``down_before``: a beat written
    meanwhile, or a registration, unsilences the row). ``hosts``: name -> its last beat as
    the caller's liveness had it (the flag's time). Stamps ``seq``, so every replica's
    index learns the mark from the change feed. Their running VMs are flagged in their
    ``reason`` (two more statements, however many hosts). Returns, for the hosts marked
    now, how many of each one's VMs were flagged."""
    if not hosts:
        return {}
    t, v = Host.__table__, Vm.__table__
    seq = next_seq(session)
    names = sorted(hosts)
    marked: list[str] = []
    for i in range(0, len(names), 500):
        marked += session.connection().execute(
            t.update().where(t.c.name.in_(names[i:i + 500]), t.c.down_since.is_(None), t.c.last_heartbeat < before)
            .values(down_since=now, seq=seq).returning(t.c.name)).scalars().all()
    flagged = dict.fromkeys(marked, 0)
    for i in range(0, len(marked), 500):
        flagged.update(session.execute(select(Vm.host, func.count()).where(
            Vm.host.in_(marked[i:i + 500]), Vm.status == VmStatus.RUNNING, Vm.reason == "").group_by(Vm.host)).all())
    flags = [{"f_host": n, "f_reason": DOWN_FLAG.format(
        host=n, since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(hosts[n])))} for n in marked if flagged[n]]
    if flags:
        session.connection().execute(v.update().where(v.c.host == bindparam("f_host"),
                                                      v.c.status == VmStatus.RUNNING, v.c.reason == "")
                                     .values(reason=bindparam("f_reason")), flags)
    return flagged


def clear_down_flags(*, session: Session, hosts: Sequence[str]) -> None:
    """The marked-down flags of ``hosts``' VMs go (the hosts beat or registered again)."""
    for i in range(0, len(hosts), 500):
        session.execute(update(Vm).where(Vm.host.in_(hosts[i:i + 500]), Vm.reason.like(_DOWN_FLAG_LIKE))
                        .values(reason=""))


def back_up(*, session: Session, host: Host, seq: Callable[[], int] | None = None) -> None:
    """A host marked down registers again: the mark and its VMs' flags go (``seq``: the
    change stamp to use, as ``upsert_host``'s)."""
    if host.down_since is None:
        return
    host.down_since = None
    host.seq = seq() if seq is not None else next_seq(session)  # every replica's index must see the mark go
    clear_down_flags(session=session, hosts=[host.name])


def silent(*, session: Session, before: float) -> Sequence[Any]:
    """(name, rack, last_heartbeat, down_since) of the hosts silent since ``before``
    (``down_before``; indexed on last_heartbeat: the silent hosts, not the fleet)."""
    return session.execute(select(Host.name, Host.rack, Host.last_heartbeat, Host.down_since)
                           .where(Host.last_heartbeat < before)).all()


def rack_sizes(*, session: Session) -> dict[str, int]:
    return dict(session.execute(select(Host.rack, func.count()).group_by(Host.rack)).all())


def heartbeat_many(*, session: Session, beats: dict[str, float], heartbeat_timeout_s: float,
                   was_down: set[str] | None = None) -> list[str]:
    """Many hosts' heartbeats in a few statements, however many there are: one read of
    their last heartbeats, the hosts back from down in one executemany (one change stamp
    for the batch, their marks cleared, their VMs' flags in one more statement), the
    rest in another. After a scheduler outage every host is "back" at once: row by row,
    10,000 of them took a PostgreSQL flush past the heartbeat timeout (measured: 953
    false downs in bench/fleet_pulse.py). ``was_down``: the hosts that were down when
    they beat, as the caller's shared liveness had it (the recorded ``last_heartbeat`` is
    only a floor under it); None: judged by the recorded one. Returns the names of hosts that no longer exist."""
    names = list(beats)
    last: dict[str, tuple[float, float | None]] = {}
    for i in range(0, len(names), 500):
        part = names[i:i + 500]
        last.update((n, (hb, down)) for n, hb, down in session.execute(
            select(Host.name, Host.last_heartbeat, Host.down_since).where(Host.name.in_(part))).all())
    gone = [n for n in names if n not in last]
    if was_down is None:
        back = [n for n in last if is_down(last[n][0], now=beats[n], heartbeat_timeout_s=heartbeat_timeout_s)]
    else:  # the caller judged each beat against the shared liveness (``service.pulse``)
        back = [n for n in last if n in was_down or last[n][1] is not None]
    t = Host.__table__
    if back:
        session.connection().execute(
            t.update().where(t.c.name == bindparam("b_name"))
            .values(last_heartbeat=bindparam("b_t"), seq=next_seq(session), down_since=None),
            [{"b_name": n, "b_t": beats[n]} for n in back])
        clear_down_flags(session=session, hosts=[n for n in back if last[n][1] is not None])
    skip = set(back)
    rest = [{"b_name": n, "b_t": beats[n]} for n in last if n not in skip]
    if rest:
        session.connection().execute(t.update().where(t.c.name == bindparam("b_name"))
                                     .values(last_heartbeat=bindparam("b_t")), rest)
    return gone


def set_admin_state(*, session: Session, name: str, state: str, now: float, owner: str, reason: str,
                    since: float | None) -> Host:
    """The admin state and who holds the host in it, why, since when (the service decides
    whether this caller may; ``owner`` "" while active)."""
    h = get_host(session=session, name=name)
    h.admin_state = state
    h.admin_owner, h.admin_reason, h.admin_since = owner, reason, since
    h.generation += 1
    h.seq = next_seq(session)  # the placement index must see it
    h.updated = now
    session.flush()
    return h


def bump_usage(*, session: Session, name: str, seen_generation: int, usage: Usage, now: float,
               seq: int | None = None) -> bool:
    """Write the host's new usage iff nobody changed it since ``seen_generation``.
    False = lost the race (0 rows): the caller rolls back and retries. ``seq``: this
    transaction's change stamp when the caller already took one (a claim batch)."""
    seq = next_seq(session) if seq is None else seq
    res = session.connection().execute(_stmts().bump, {"n": name, "seen": seen_generation, "u": usage.to_dict(),
                                                       "g": seen_generation + 1, "t": now, "seq": seq})
    return res.rowcount == 1


@cache
def _stmts():  # type: ignore[no-untyped-def]
    """The claim path's statements, built once (constructing SQLAlchemy expressions per
    call cost more than running them)."""
    from types import SimpleNamespace
    row = select(*CLAIM_COLUMNS).where(Host.name == bindparam("n"))
    return SimpleNamespace(
        bump=update(Host).where(Host.name == bindparam("n"), Host.generation == bindparam("seen"))
        .values(usage=bindparam("u", type_=Host.usage.type), generation=bindparam("g"), updated=bindparam("t"),
                seq=bindparam("seq")),
        row=row,
        pg_seq=text("SELECT pg_current_xact_id()::text::bigint"),
        pg_pos=text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"),
        quiet=select(Host.name, Host.last_heartbeat).where(Host.last_heartbeat < bindparam("b")))


def next_seq(session: Session) -> int:
    """The change stamp of this write transaction. SQLite: the ``fleet`` counter row
    (writers are serialised, so stamps appear in commit order without gaps). PostgreSQL:
    the transaction's own 64-bit id (no shared row, nothing held to commit); readers ask
    for ``seq >= xmin`` of their previous snapshot, which covers transactions that were
    still in flight then (``feed``)."""
    if lite.serves(session):
        return lite.next_seq(session)
    return session.connection().execute(_stmts().pg_seq).scalar_one()


def feed_position(*, session: Session) -> int:
    """Where the next ``feed`` starts, taken in the same snapshot as the read
    that precedes it (the session must be a snapshot: SQLite read tx, PostgreSQL
    REPEATABLE READ): PostgreSQL's oldest in-flight transaction id, else the counter."""
    if lite.serves(session):
        return lite.counter(session) + 1
    return session.connection().execute(_stmts().pg_pos).scalar_one()


CLAIM_COLUMNS = (Host.name, Host.generation, Host.usage, Host.layout_rev, Host.admin_state,
                 Host.last_heartbeat, Host.rack)


def claim_row(*, session: Session, name: str, lock: bool, skip_locked: bool = False) -> Any:
    """The columns a claim needs (not the layout), row-locked on PostgreSQL when ``lock``:
    concurrent claims on the same host then queue for a moment instead of losing the
    generation race (which stays the guard). ``skip_locked`` (a claim batch, which holds
    several rows to its commit and must never wait on another replica's batch, or two
    batches could deadlock): None when another transaction holds the row."""
    if pg.serves(session):
        row = pg.claim_row(session, name, lock=lock, skip_locked=skip_locked)
        if row is False:
            return None
    else:  # SQLite: the writer lock is the lock
        row = session.connection().execute(_stmts().row, {"n": name}).one_or_none()
    if row is None:
        raise HostNotFound(f"no host {name!r}", field="name")
    return row


def feed(*, session: Session, position: int) -> tuple[int, Sequence[Any]]:
    """(next position, hosts stamped at or after ``position``): the index's incremental
    read. SQLite: the counter first, and no read at all when it did not move (the session
    must be a snapshot). PostgreSQL: one statement (``pg.feed``), any session."""
    if lite.serves(session):
        nxt = lite.counter(session) + 1
        return nxt, (lite.changed_since(session, position) if nxt != position else [])
    return pg.feed(session, position)


def quiet(*, session: Session, before: float) -> Sequence[Any]:
    """(name, last_heartbeat) of the hosts silent since ``before`` (``down_before``;
    indexed: the hosts that are down, not the fleet)."""
    if lite.serves(session):
        return lite.quiet(session, before)
    return session.connection().execute(_stmts().quiet, {"b": before}).all()


def fleet_state(*, session: Session) -> Sequence[Any]:
    """Every host's (name, generation, layout_rev, admin_state, last_heartbeat, seq, owner,
    rack, down_since): the index's periodic full pass (heartbeats do not stamp seq; hosts
    may be deleted)."""
    return session.execute(select(Host.name, Host.generation, Host.layout_rev, Host.admin_state,
                                  Host.last_heartbeat, Host.seq, Host.owner, Host.rack, Host.down_since)).all()


def owners(*, session: Session, names: Sequence[str]) -> dict[str, str]:
    """name -> the principal that registered it ("" when none recorded)."""
    out: dict[str, str] = {}
    for i in range(0, len(names), 500):
        out.update(session.execute(select(Host.name, Host.owner).where(Host.name.in_(names[i:i + 500]))).all())
    return out


def usages(*, session: Session, names: Sequence[str]) -> dict[str, tuple[int, Usage]]:
    """name -> (generation, usage). Each distinct stored usage is parsed once (``Usage`` is
    immutable): an idle fleet's hosts all hold the same."""
    out: dict[str, tuple[int, Usage]] = {}
    parsed: dict[str | None, Usage] = {}
    for i in range(0, len(names), 1000):
        for name, gen, stored in session.execute(select(Host.name, Host.generation, cast(Host.usage, Text))
                                                 .where(Host.name.in_(names[i:i + 1000]))):
            if (u := parsed.get(stored)) is None:
                u = parsed[stored] = Usage.from_dict(json.loads(stored) if stored else {})
            out[name] = (gen, u)
    return out


def hosts_by_name(*, session: Session, names: Sequence[str]) -> list[Host]:
    out: list[Host] = []
    for i in range(0, len(names), 500):
        out += session.scalars(select(Host).where(Host.name.in_(names[i:i + 500]))).all()
    return out
