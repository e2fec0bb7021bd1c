"""Orders admitted before the view sees them (§7.4) add up, and a duplicate name never counts (§14)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.decisions.orders import Order
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.validation import Validation
from cozygpu.runtime.writes import Writer
from tests.support.views import A10, budget, cluster, created, device, gpu_class, node
from tests.support.writing import writer

TENANT = "system:serviceaccount:t1:tenant"


def create(v: Validation, name: str, count: int, class_name: str = "a10") -> str | None:
    """The GPUDevice webhook's answer to a create: None when admitted, else the denial."""
    try:
        asyncio.run(v.device("CREATE", created(name, class_name, count=count), None, TENANT, dry_run=False))
    except Refusal as e:
        return str(e)
    return None


def test_a_duplicate_create_in_flight_cannot_shrink_the_first_ones_reservation() -> None:
    """§14: with `total: 4`, creating `a` (3), `a` again (1) and `b` (3) before the view sees any: the second
    `a` is refused (the API server would turn it away after admission), so `b` meets the 3 units `a` holds."""
    v = Validation(
        cluster(nodes=[node("n1", {A10: 8})], classes=[gpu_class("a10")], budgets=[budget("b", "t1", total=4)]),
        Reservations(ttl=30),
    )
    assert create(v, "a", 3) is None
    assert create(v, "a", 1) == "GPUDevice a already exists in namespace t1, or is being created"
    refusal = create(v, "b", 3)
    assert refusal is not None and "budget" in refusal.lower()


def test_a_create_of_a_name_the_view_holds_reserves_nothing() -> None:
    """A create of a device that exists is refused before it reserves: no phantom order against the budget."""
    reservations = Reservations(ttl=30)
    v = Validation(
        cluster(nodes=[node("n1", {A10: 8})], classes=[gpu_class("a10")], devices=[device("a", phase="Pending")]),
        reservations,
    )
    assert create(v, "a", 2) is not None
    assert reservations.orders() == []


@pytest.mark.parametrize("name", ["a", "b"])
def test_the_view_seeing_a_device_ends_its_reservation(name: str) -> None:
    """Once seen, an order counts in the view, not twice."""
    reservations = Reservations(ttl=30)
    v = Validation(cluster(nodes=[node("n1", {A10: 8})], classes=[gpu_class("a10")]), reservations)
    assert create(v, name, 1) is None and reservations.holds("t1", name)
    reservations.seen("t1", name)
    assert reservations.orders() == [] and not reservations.holds("t1", name)


def test_where_budgets_are_required_a_held_device_needs_one_at_create() -> None:
    """§7, `--budgets-required`: the GPUDevice webhook refuses a held order in a namespace no budget covers."""
    nodes, classes = [node("n1", {A10: 8})], [gpu_class("a10")]
    strict = Validation(cluster(nodes=nodes, classes=classes), Reservations(ttl=30), budgets_required=True)
    assert create(strict, "a", 1) == "GPUDevice a: namespace t1 has no GPUBudget, and this cluster requires one"
    lenient = Validation(cluster(nodes=nodes, classes=classes), Reservations(ttl=30))
    assert create(lenient, "a", 1) is None


def test_reservations_of_two_admissions_add_up_even_for_one_name() -> None:
    """§7.4, §14: a reservation is the admission's (keyed by its review's uid): a second admission's order for the
    same name is added, never put in place of the first; the view's sighting of the name ends both."""
    reservations = Reservations(ttl=30)
    reservations.add("t1", "a", Order("t1", "a10", 3, "a"), review="review-1")
    reservations.add("t1", "a", Order("t1", "a10", 1, "a"), review="review-2")
    assert sorted(o.count for o in reservations.orders()) == [1, 3]
    assert reservations.holds("t1", "a")
    reservations.seen("t1", "a")
    assert reservations.orders() == [] and not reservations.holds("t1", "a")


def test_a_held_order_is_reserved_under_its_reviews_uid() -> None:
    """The webhook passes the review's uid down; what it reserves is found under it."""
    reservations = Reservations(ttl=30)
    v = Validation(cluster(nodes=[node("n1", {A10: 8})], classes=[gpu_class("a10")]), reservations)
    asyncio.run(v.device("CREATE", created("a", count=2), None, TENANT, dry_run=False, review="uid-1"))
    assert reservations.orders() == [Order("t1", "a10", 2, "a")]
    reservations.add("t1", "a", Order("t1", "a10", 2, "a"), review="uid-1")  # the same admission again: one order
    assert len(reservations.orders()) == 1


def test_a_name_the_view_still_holds_but_the_api_server_has_deleted_may_be_created_again() -> None:
    """A device deleted a moment ago, its deletion not yet in the view: the fresh read says it is gone, so its
    name is not refused; one the API server still has is."""
    view = cluster(nodes=[node("n1", {A10: 8})], classes=[gpu_class("a10")], devices=[device("a", phase="Pending")])

    async def gone(kind: Kind, namespace: str, name: str) -> bool:
        return False

    async def there(kind: Kind, namespace: str, name: str) -> bool:
        return True

    assert create(Validation(view, Reservations(ttl=30), exists=gone), "a", 1) is None
    assert create(Validation(view, Reservations(ttl=30), exists=there), "a", 1) is not None


def _fresh(w: Writer) -> Callable[[Kind, str, str], Awaitable[bool]]:
    """The operator's fresh read: through the writer, so what the API has reaches the view too."""

    async def exists(kind: Kind, namespace: str, name: str) -> bool:
        return (await w.read(kind, name, namespace)).body is not None

    return exists


def test_a_class_created_a_moment_before_the_device_is_read_fresh_not_refused() -> None:
    """§9 (issue 33 item 5): one manifest applies a GPUClass and a GPUDevice of it; the device's create may reach
    the webhook before the class's event reaches the view. The class is read fresh and the device admitted; before,
    it was refused with "GPUClass acc-u does not exist"."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    kube.put(kinds.GPU_CLASS, gpu_class("acc-u"))  # in the API, not yet in the view
    assert "acc-u" not in view.cluster.classes
    assert create(Validation(view.cluster, Reservations(ttl=30), exists=_fresh(w)), "a", 1, "acc-u") is None
    assert "acc-u" in view.cluster.classes  # what the read found reached the view


def test_a_class_the_api_server_does_not_have_either_is_refused_naming_the_device_and_the_class() -> None:
    """The fresh read finds no class: refused, naming the device and the class it names."""
    w, view, _ = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    refusal = create(Validation(view.cluster, Reservations(ttl=30), exists=_fresh(w)), "a", 1, "acc-x")
    assert refusal == "GPUDevice a: GPUClass acc-x does not exist"


def units(orders: list[Order]) -> dict[tuple[str, str], int]:
    return {(o.namespace, o.class_name): o.count for o in orders}


def test_prior_orders_are_the_reserved_units_summed_per_namespace_and_class() -> None:
    """§7.4: decisions count one order per namespace and class, holding every reservation's units there, less the
    admission asking (`excluding`); a reservation the view has seen counts no more."""
    reservations = Reservations(ttl=30)
    reservations.add("t1", "a", Order("t1", "a10", 3, "a"), review="r1")
    reservations.add("t1", "b", Order("t1", "a10", 2, "b"), review="r2")
    reservations.add("t1", "c", Order("t1", "l40s", 1, "c"), review="r3")
    reservations.add("t2", "a", Order("t2", "a10", 4, "a"), review="r4")
    assert units(reservations.prior()) == {("t1", "a10"): 5, ("t1", "l40s"): 1, ("t2", "a10"): 4}
    assert units(reservations.prior(excluding="r2")) == {("t1", "a10"): 3, ("t1", "l40s"): 1, ("t2", "a10"): 4}
    assert units(reservations.prior(excluding="r3")) == {("t1", "a10"): 5, ("t2", "a10"): 4}
    reservations.seen("t1", "a")
    reservations.cancel("r4")
    assert units(reservations.prior()) == {("t1", "a10"): 2, ("t1", "l40s"): 1}


def test_an_expired_reservation_leaves_the_prior_orders_and_a_renewed_one_stays() -> None:
    """A reservation whose create never came (refused after the webhooks) stops counting once it expires; one made
    again under its admission's key is new, and counts for a whole ttl again."""
    expired = Reservations(ttl=-1)
    expired.add("t1", "a", Order("t1", "a10", 3, "a"), review="r1")
    assert expired.prior() == [] and expired.orders() == []
    live = Reservations(ttl=30)
    live.add("t1", "a", Order("t1", "a10", 3, "a"), review="r1")
    live.add("t1", "b", Order("t1", "a10", 1, "b"), review="r2")
    live.add("t1", "a", Order("t1", "a10", 2, "a"), review="r1")  # the same admission again: in place of the first
    assert [(o.class_name, o.count) for o in live.prior()] == [("a10", 3)]
