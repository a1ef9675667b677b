"""A subscription whose state was lost is damage, not a new subscription (issue #31, defect 2).

Real subscriptions with real acknowledgements on a local disk; the state's files are removed
with ``os.remove`` as a failing disk or a careless hand would, leaving the subscription's
folder. A creation cut short is a real child process SIGKILLed while it creates subscriptions
one after another.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from filepulsar.connector.admin import Admin
from filepulsar.connector.client import Client, ConsumerType, InitialPosition, Timeout
from filepulsar.storage import TopicName, create_topic, open_blob_store
from filepulsar.storage.errors import DataLossError
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import (
    SubscriptionStore,
    ensure_subscription,
    list_subscriptions,
)

pytestmark = pytest.mark.contract

TOPIC = "persistent://public/default/lost"


def _state_dir(root: Path, sub: str) -> Path:
    return root / "topics/persistent/public/default/lost/subscriptions" / sub / "state"


def _subscribe(client: Client, where: InitialPosition) -> object:
    return client.subscribe("lost", "s", consumer_type=ConsumerType.Shared, initial_position=where)


def _values(consumer: object, n: int) -> list[str]:
    out = []
    for _ in range(n):
        try:
            m = consumer.receive(200)  # type: ignore[attr-defined]
        except Timeout:
            break
        out.append(m.data().decode())
    return out


@pytest.mark.parametrize("where", [InitialPosition.Latest, InitialPosition.Earliest])
def test_a_lost_subscription_state_is_damage_naming_the_path(
    tmp_path: Path, where: InitialPosition
) -> None:
    """4 of 10 messages acknowledged, then the state's files removed (the folder left): the
    next subscribe fails with DataLossError naming the state's folder and the creation record
    (old code re-created the subscription: at Latest the 6 unacknowledged messages were never
    delivered, at Earliest the 4 acknowledged ones came again, no error). Deleting the
    subscription is the way out; subscribing then creates it afresh."""
    root = tmp_path / "root"
    with Client(str(root)) as client:
        producer = client.create_producer("lost", batching_enabled=False)
        if where is InitialPosition.Latest:
            consumer = _subscribe(client, where)  # created before the messages: it gets them
        for i in range(10):
            producer.send(str(i).encode())
        if where is InitialPosition.Earliest:
            consumer = _subscribe(client, where)
        for _ in range(4):
            consumer.acknowledge(consumer.receive(5000))  # type: ignore[attr-defined]
        consumer.close()  # type: ignore[attr-defined]
    files = list(_state_dir(root, "s").iterdir())
    assert files
    for f in files:
        os.remove(f)
    assert _state_dir(root, "s").is_dir()
    with Client(str(root)) as client:
        with pytest.raises(DataLossError) as info:
            _subscribe(client, where)
        message = str(info.value)
        assert str(_state_dir(root, "s")) in message and "subscription.json" in message
        assert "\n" not in message
        store = client.store
        with pytest.raises(DataLossError):
            SubscriptionStore(store, TopicName.parse(TOPIC), "s").latest()
        Admin(store=store).topics().delete_subscription(TOPIC, "s")
        again = _subscribe(client, InitialPosition.Earliest)
        assert sorted(_values(again, 20)) == [str(i) for i in range(10)]  # a new subscription


CREATOR = textwrap.dedent(
    """
    import sys
    from filepulsar.storage import TopicName, open_blob_store
    from filepulsar.storage.subscriptions import ensure_subscription
    store = open_blob_store(sys.argv[1])
    topic = TopicName.parse("lost")
    i = 0
    while True:
        ensure_subscription(store, topic, f"s{i}")
        print(i, flush=True)  # s<i> was created (its state and its record)
        i += 1
    """
)


@pytest.mark.parametrize("round_", range(3))
@pytest.mark.procs
def test_creations_cut_short_by_sigkill_never_error_afterwards(tmp_path: Path, round_: int) -> None:
    """A child process creates subscriptions one after another and is SIGKILLed at a random
    moment: whatever a creation left (an empty folder, a state without its record), the next
    subscribe works, on every subscription the child reported created with its state intact,
    and a first-time subscription is created with its record."""
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    create_topic(store, "lost")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), os.getcwd()])),
    )
    child = subprocess.Popen(
        [sys.executable, "-c", CREATOR, str(root)], stdout=subprocess.PIPE, env=env, text=True
    )
    assert child.stdout is not None
    created = []
    stop_after = random.Random(round_).randint(5, 40)
    for line in child.stdout:
        created.append(int(line))
        if len(created) >= stop_after:
            break
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL and len(created) == stop_after  # killed mid-run
    topic = TopicName.parse(TOPIC)
    names = list_subscriptions(store, topic)
    assert {f"s{i}" for i in created} <= set(names)
    for name in [*names, "never-before"]:
        sc = SubscriptionConsumer(store, topic, name, sub_type="Shared", consumer_name="c")
        assert sc.state().name == name
        assert store.exists(f"{sc._store.record_key}")
        sc.close()


def test_a_creation_racing_another_is_not_read_as_a_loss(tmp_path: Path) -> None:
    """Two processes subscribe to a new subscription at once: the second finds no state, and
    before it reads the creation record the first has written both its state and its record.
    The second must join the subscription, not report its state as lost (CI saw it on S3:
    four consumer processes subscribing together, one failed with DataLossError). Versions as
    files, as on an object store (the hooks do not see a local journal's segments)."""
    from filepulsar.storage.blobstore.local import LocalBlobStore
    from tests.test_commit_protocol import HookedStore

    root = tmp_path / "root"
    plain = LocalBlobStore(str(root), journal=False)
    create_topic(plain, "lost")
    topic = TopicName.parse(TOPIC)
    first = SubscriptionStore(plain, topic, "s")
    raced: list[bool] = []

    def before(op: str, key: str) -> None:
        # The second creator looked for the state and found none; it now reads the record.
        if op == "get" and key == first.record_key and not raced:
            raced.append(True)
            assert ensure_subscription(plain, topic, "s")  # the first creator, whole

    hooked = HookedStore(LocalBlobStore(str(root), journal=False), before)
    assert not ensure_subscription(hooked, topic, "s")  # joined what the other one created
    assert raced == [True]
    assert SubscriptionStore(plain, topic, "s").latest().name == "s"
