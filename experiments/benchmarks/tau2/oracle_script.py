"""The offline oracle's script for a τ² task: the lookups a careful agent makes, then the reference.

This is the oracle side only; the environment, the user and the evaluator
(:mod:`.environment`, :mod:`.evaluation`) know nothing of it, so a live LLM agent
plays the same episodes without it. The script becomes a
:class:`~contextrender.experiments.runtime.oracle.Reference`, which the shared
context-bounded oracle follows with the same visibility rule as on BFCL: an
argument value (≥ 4 characters) that appeared earlier in the transcript but is
not in what the policy rendered is emitted wrong, and τ²'s evaluator then fails
the database (and action) check.

Why lookups: τ²'s reference actions are what the task needs, not what an agent
does — retail has a median of 5 of them, airline 2, often without the reads
that bring the ids in (airline task 11 is one ``update_reservation_flights``).
Recorded runs of strong agents make a median of 8 calls. The lookup rule below
adds the reads a careful agent makes, chosen from the task and the domain
database only (never from the policy under test), so that ids reach the
transcript the way they do in real runs: from tool results, turns before use.

The rule (:func:`build_script`), with ``R`` the task's reference actions (all
``requestor: assistant`` in retail and airline), in order:

1. **Identify** (retail). If ``R`` opens with ``find_user_id_by_*`` calls they
   are kept (they may be expected to fail: a wrong e-mail or zip, then the
   right one). Otherwise one is added: ``find_user_id_by_email`` with the
   user's e-mail if the opening message contains it, else
   ``find_user_id_by_name_zip`` with the user's name and zip from the
   database. (Airline users give their user id; τ² has no look-up tool.)
2. **Look up** (``L``), in this order:

   * ``get_user_details(user)``;
   * the orders (retail) or reservations (airline) that ``R`` names in any
     argument and that exist: if the opening message names all of them, each
     of them; otherwise the user did not say which, and the agent reads the
     user's orders/reservations in the order ``get_user_details`` lists them,
     up to and including the last one ``R`` names (then any named one not in
     that list);
   * retail: ``get_product_details`` for the product of every item that an
     exchange or item modification in ``R`` replaces;
   * airline: for every ``book_reservation`` and for every
     ``update_reservation_flights`` that changes flights, a search per leg
     (outbound, and return on round trips) whose flights change:
     ``search_direct_flight`` for one flight, ``search_onestop_flight`` for two
     (origin of the first, destination of the last, date of the first).
3. **Play** ``R`` after the identification, in order, without the read-only
   calls that repeat a call of ``L`` exactly and come before ``R``'s first
   write (the database has not changed yet, so they would return the same).
4. **Close** with a message stating each of the task's ``communicate_info``
   strings (τ² checks them by substring); they are the closing values the
   oracle checks like arguments.

Deterministic: the same task and package give the same script (no randomness,
no dict-order dependence beyond the package's own lists).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from contextrender.experiments.benchmarks.tau2.environment import Tau2Task, new_environment
from contextrender.experiments.runtime.oracle import Reference, ScriptedCall

__all__ = ["Script", "Step", "build_script", "closing_message"]

IDENTIFY = ("find_user_id_by_email", "find_user_id_by_name_zip")
ITEM_REPLACING = ("exchange_delivered_order_items", "modify_pending_order_items")
FLIGHT_WRITES = ("book_reservation", "update_reservation_flights")


@dataclass(frozen=True)
class Step:
    """One scripted call and why it is there: ``identify``, ``lookup`` (the rule) or ``reference``."""

    name: str
    arguments: dict[str, Any]
    source: str


@dataclass(frozen=True)
class Script:
    task_id: str
    steps: tuple[Step, ...]
    closing: str
    closing_values: tuple[str, ...]
    dropped: tuple[Step, ...]  # reference reads left out because a lookup made them already

    @functools.cached_property
    def reference(self) -> Reference:
        return Reference(turns=(tuple(ScriptedCall(s.name, s.arguments) for s in self.steps),),
                         closing=(self.closing,), closing_values=(self.closing_values,))

    def count(self, source: str) -> int:
        return sum(1 for s in self.steps if s.source == source)


def closing_message(communicate_info: list[str] | None) -> str:
    """The oracle's last message; it states every ``communicate_info`` string verbatim."""
    if communicate_info:
        return ("Here is a summary of what I found and did: " + "; ".join(communicate_info)
                + ". Is there anything else I can help you with?")
    return "Your request has been handled. Is there anything else I can help you with?"


def _named(value: str, text: str) -> bool:
    """Whether the opening message names an order/reservation id (orders also without their '#')."""
    for v in {value, value.lstrip("#")}:
        if re.search(r"(?<![A-Za-z0-9_])" + re.escape(v) + r"(?![A-Za-z0-9_])", text):
            return True
    return False


def _ids_in(actions: list[Any], key: str, exists: Any) -> list[str]:
    out: list[str] = []
    for a in actions:
        v = a.arguments.get(key)
        if isinstance(v, str) and v in exists and v not in out:
            out.append(v)
    return out


def _scan(named_ids: list[str], listed: list[str], opening: str) -> list[str]:
    """Which of the user's orders/reservations a careful agent reads (rule step 2, second bullet)."""
    if not named_ids or all(_named(i, opening) for i in named_ids):
        return list(named_ids)
    last = max((listed.index(i) for i in named_ids if i in listed), default=-1)
    return listed[: last + 1] + [i for i in named_ids if i not in listed]


def _user_from_opening(opening: str, users: Any, name_zip: Any) -> str | None:
    """The user the opening message identifies: a user id, an e-mail, or a name with a zip."""
    for uid in sorted(users):
        if _named(uid, opening):
            return uid
    for uid in sorted(users):
        first, last, email, zip_ = name_zip(users[uid])
        if email and email in opening:
            return uid
    for uid in sorted(users):
        first, last, email, zip_ = name_zip(users[uid])
        if first in opening and last in opening and zip_ and _named(zip_, opening):
            return uid
    return None


def _task_user(task: Tau2Task, db: Any, actions: list[Any]) -> str | None:
    """The task's user: named by a reference action, owning the order (retail) or reservation
    (airline) an action names, or described in the opening message."""
    ref_key, refs = ("order_id", db.orders) if task.domain == "retail" else ("reservation_id", db.reservations)
    for a in actions:
        if isinstance(a.arguments.get("user_id"), str) and a.arguments["user_id"] in db.users:
            return a.arguments["user_id"]
    for a in actions:
        ref = a.arguments.get(ref_key)
        if isinstance(ref, str) and ref in refs:
            return refs[ref].user_id
    return _user_from_opening(task.opening, db.users,
                              lambda u: (u.name.first_name, u.name.last_name, u.email, u.address.zip))


# -- retail -----------------------------------------------------------------------------

def _retail_identify(task: Tau2Task, db: Any, uid: str) -> Step:
    u = db.users[uid]
    if u.email and u.email in task.opening:
        return Step("find_user_id_by_email", {"email": u.email}, "identify")
    return Step("find_user_id_by_name_zip",
                {"first_name": u.name.first_name, "last_name": u.name.last_name, "zip": u.address.zip}, "identify")


def _retail_lookups(task: Tau2Task, db: Any, uid: str, actions: list[Any]) -> list[Step]:
    steps = [Step("get_user_details", {"user_id": uid}, "lookup")]
    orders = _scan(_ids_in(actions, "order_id", db.orders), list(db.users[uid].orders), task.opening)
    steps += [Step("get_order_details", {"order_id": o}, "lookup") for o in orders]
    products: list[str] = []
    for a in actions:
        if a.name not in ITEM_REPLACING or a.arguments.get("order_id") not in db.orders:
            continue
        items = {it.item_id: it.product_id for it in db.orders[a.arguments["order_id"]].items}
        for item in a.arguments.get("item_ids") or []:
            p = items.get(item)
            if p is not None and p not in products:
                products.append(p)
    steps += [Step("get_product_details", {"product_id": p}, "lookup") for p in products]
    return steps


# -- airline ----------------------------------------------------------------------------

def _legs(flights: list[tuple[str, str]], db: Any, destination: str, flight_type: str) -> list[list[tuple[str, str]]]:
    """Split a reservation's flights into the outbound leg and (round trips) the return leg."""
    if flight_type != "round_trip":
        return [flights] if flights else []
    for i, (fn, _date) in enumerate(flights):
        if fn in db.flights and db.flights[fn].destination == destination:
            return [leg for leg in (flights[: i + 1], flights[i + 1:]) if leg]
    return [flights] if flights else []


def _search(leg: list[tuple[str, str]], db: Any) -> list[Step]:
    segs = [(db.flights[fn], date) for fn, date in leg if fn in db.flights]
    if len(segs) == 2:
        return [Step("search_onestop_flight", {"origin": segs[0][0].origin, "destination": segs[1][0].destination,
                                                "date": segs[0][1]}, "lookup")]
    return [Step("search_direct_flight", {"origin": f.origin, "destination": f.destination, "date": d}, "lookup")
            for f, d in segs]


def _airline_lookups(task: Tau2Task, db: Any, uid: str, actions: list[Any]) -> list[Step]:
    steps = [Step("get_user_details", {"user_id": uid}, "lookup")]
    reservations = _scan(_ids_in(actions, "reservation_id", db.reservations), list(db.users[uid].reservations),
                         task.opening)
    steps += [Step("get_reservation_details", {"reservation_id": r}, "lookup") for r in reservations]
    for a in actions:
        if a.name not in FLIGHT_WRITES:
            continue
        new = [(f["flight_number"], f["date"]) for f in a.arguments.get("flights") or []]
        if a.name == "book_reservation":
            current: list[tuple[str, str]] = []
            legs = _legs(new, db, a.arguments.get("destination", ""), a.arguments.get("flight_type", "one_way"))
        else:
            res = db.reservations.get(a.arguments.get("reservation_id"))
            if res is None:
                continue
            current = [(f.flight_number, f.date) for f in res.flights]
            if new == current:  # a cabin change on the same flights: nothing to search
                continue
            legs = _legs(new, db, res.destination, getattr(res.flight_type, "value", res.flight_type))
        for leg in legs:
            if any(seg not in current for seg in leg):
                steps += [s for s in _search(leg, db) if s not in steps]
    return steps


# -- the script -------------------------------------------------------------------------

@functools.cache
def _pristine(domain: str) -> Any:
    """One untouched environment per domain, only READ by the rule (its database and tool types)."""
    return new_environment(domain)


def build_script(task: Tau2Task) -> Script:
    """The oracle's calls for ``task`` (module docstring: the rule), from the task and a fresh database."""
    criteria = task.task.evaluation_criteria
    actions = list(criteria.actions or []) if criteria is not None else []
    if any(a.requestor != "assistant" for a in actions):
        raise ValueError(f"τ² {task.domain} task {task.id}: reference actions by the user cannot be played "
                         "by the agent-side oracle")
    env = _pristine(task.domain)
    db = env.tools.db
    lead = 0
    if task.domain == "retail":
        while lead < len(actions) and actions[lead].name in IDENTIFY:
            lead += 1
    head = [Step(a.name, dict(a.arguments), "reference") for a in actions[:lead]]
    rest = actions[lead:]
    uid = _task_user(task, db, actions)
    lookups: list[Step] = []
    if uid is not None:
        if task.domain == "retail":
            if not head:
                head = [_retail_identify(task, db, uid)]
            lookups = _retail_lookups(task, db, uid, rest)
        else:
            lookups = _airline_lookups(task, db, uid, rest)
    seen = {(s.name, repr(sorted(s.arguments.items()))) for s in lookups}
    played: list[Step] = []
    dropped: list[Step] = []
    written = False
    for a in rest:
        step = Step(a.name, dict(a.arguments), "reference")
        kind = env.tools.tool_type(a.name).value if env.tools.has_tool(a.name) else "write"
        written |= kind == "write"
        if not written and kind == "read" and (a.name, repr(sorted(a.arguments.items()))) in seen:
            dropped.append(step)
            continue
        played.append(step)
    info = list(criteria.communicate_info or []) if criteria is not None else []
    return Script(task.id, tuple(head + lookups + played), closing_message(info), tuple(info), tuple(dropped))
