"""One vocabulary: every closed set is one enum, parsed by one function that takes both
pulsar-client's spelling (``KeyShared``) and the wire spelling (``Key_Shared``), at every entry
point a user types it -- the client, the Spark options and the command line.

Entry points per set (a set without a CLI flag has none on the command line):

================  =====================================  ===================  ==============
set               client                                 Spark options        CLI
================  =====================================  ===================  ==============
subscription      ``subscribe(consumer_type=)``          ``subscriptionType``  ``consume -t``
initial position  ``subscribe(initial_position=)``       ``subscription...``   ``consume -p``,
                                                                              ``examine -i``
Key_Shared mode   ``ConsumerKeySharedPolicy``            ``keySharedMode``,
                                                         ``key_shared_assign``
routing mode      ``create_producer(message_routing_...`` ``messageRoutingMode``
hashing scheme    ``create_producer(hashing_scheme=)``   ``hashingScheme``
batching type     ``create_producer(batching_type=)``    ``batchingType``
compression       ``create_producer(compression_type=)`` ``compressionType``
access mode       ``create_producer(access_mode=)``      (no sink option)
================  =====================================  ===================  ==============
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.client import Client, ConsumerKeySharedPolicy, Timeout
from filepulsar.connector.sink.options import parse_options
from filepulsar.connector.source.options import SourceOptions
from filepulsar.dispatch import modes
from filepulsar.dispatch.modes import (
    BatchingType,
    CompressionType,
    ConsumerType,
    HashingScheme,
    InitialPosition,
    KeySharedMode,
    PartitionsRoutingMode,
    ProducerAccessMode,
    allowed_spellings,
)
from filepulsar.dispatch.selectors import selector_for_mode
from filepulsar.dispatch.selectors.auto_split import AutoSplitHashRangeSelector
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.dispatch.selectors.sticky import StickyHashRangeSelector
from filepulsar.jobs.cli import main
from filepulsar.storage import InvalidConfiguration, TopicName, open_blob_store
from filepulsar.storage.codec import Codec
from filepulsar.storage.subscriptions import SubscriptionStore

pytestmark = pytest.mark.unit

#: Per set: (member, pulsar-client spelling, wire spelling) for every member.
SPELLINGS: dict[type[modes.Mode], list[tuple[Any, str, str]]] = {
    ConsumerType: [
        (ConsumerType.Exclusive, "Exclusive", "Exclusive"),
        (ConsumerType.Shared, "Shared", "Shared"),
        (ConsumerType.Failover, "Failover", "Failover"),
        (ConsumerType.KeyShared, "KeyShared", "Key_Shared"),
    ],
    InitialPosition: [
        (InitialPosition.Latest, "Latest", "Latest"),
        (InitialPosition.Earliest, "Earliest", "Earliest"),
    ],
    KeySharedMode: [
        (KeySharedMode.AutoSplit, "AutoSplit", "AUTO_SPLIT"),
        (KeySharedMode.Sticky, "Sticky", "STICKY"),
    ],
    PartitionsRoutingMode: [
        (
            PartitionsRoutingMode.RoundRobinDistribution,
            "RoundRobinDistribution",
            "RoundRobinPartition",
        ),
        (PartitionsRoutingMode.UseSinglePartition, "UseSinglePartition", "SinglePartition"),
        (PartitionsRoutingMode.CustomPartition, "CustomPartition", "CustomPartition"),
    ],
    HashingScheme: [
        (HashingScheme.JavaStringHash, "JavaStringHash", "JavaStringHash"),
        (HashingScheme.Murmur3_32Hash, "Murmur3_32Hash", "Murmur3_32Hash"),
    ],
    BatchingType: [
        (BatchingType.Default, "Default", "Default"),
        (BatchingType.KeyBased, "KeyBased", "KeyBased"),
    ],
    CompressionType: [
        (CompressionType.NONE, "NONE", "NONE"),
        (CompressionType.LZ4, "LZ4", "LZ4"),
        (CompressionType.ZLib, "ZLib", "ZLIB"),
        (CompressionType.ZSTD, "ZSTD", "ZSTD"),
        (CompressionType.SNAPPY, "SNAPPY", "SNAPPY"),
    ],
    ProducerAccessMode: [
        (ProducerAccessMode.Shared, "Shared", "Shared"),
        (ProducerAccessMode.Exclusive, "Exclusive", "Exclusive"),
        (ProducerAccessMode.WaitForExclusive, "WaitForExclusive", "WaitForExclusive"),
        (ProducerAccessMode.ExclusiveWithFencing, "ExclusiveWithFencing", "ExclusiveWithFencing"),
    ],
}
SETS = list(SPELLINGS)


def _variants(text: str) -> list[str]:
    """The spelling as given, and in the other cases the rules allow."""
    return [text, text.lower(), text.upper(), f"  {text} "]


# ------------------------------------------------------------------------ the one parser


@pytest.mark.parametrize("cls", SETS, ids=lambda c: c.__name__)
def test_every_member_parses_from_both_spellings_in_any_case(cls: type[modes.Mode]) -> None:
    assert [m for m, _, _ in SPELLINGS[cls]] and {m for m, _, _ in SPELLINGS[cls]} == set(cls)
    for member, client_name, wire in SPELLINGS[cls]:
        assert member.name == client_name and member.wire == wire
        assert cls.parse(member) is member
        for text in (*_variants(client_name), *_variants(wire)):
            assert cls.parse(text) is member, text


@pytest.mark.parametrize("cls", SETS, ids=lambda c: c.__name__)
def test_no_two_members_share_a_spelling(cls: type[modes.Mode]) -> None:
    owners: dict[str, modes.Mode] = {}
    for m in cls:
        for spelling in (m.name, m.wire):
            assert owners.setdefault(modes._norm(spelling), m) is m, spelling


@pytest.mark.parametrize("cls", SETS, ids=lambda c: c.__name__)
def test_a_bad_value_is_one_line_listing_every_spelling(cls: type[modes.Mode]) -> None:
    with pytest.raises(InvalidConfiguration) as e:
        cls.parse("Nonsense", "the flag")
    text = str(e.value)
    assert "\n" not in text and text.startswith("the flag 'Nonsense' is not allowed: use one of ")
    for _, client_name, wire in SPELLINGS[cls]:
        assert (
            wire in text and client_name.replace("_", "").lower() in text.replace("_", "").lower()
        )
    assert isinstance(e.value, ValueError)
    with pytest.raises(InvalidConfiguration):
        cls.parse(True)
    with pytest.raises(InvalidConfiguration):
        cls.parse(None)


def test_the_client_names_are_the_vocabulary_enums() -> None:
    from filepulsar.connector import client
    from filepulsar.connector.client import types as client_types

    for cls in SETS:
        if cls is ConsumerType:
            assert modes.SubscriptionType is ConsumerType
        assert getattr(client_types, cls.__name__) is cls
        assert getattr(client, cls.__name__) is cls
    # pulsar-client's numbers are kept.
    assert (
        ConsumerType.KeyShared.value == 3
        and PartitionsRoutingMode.RoundRobinDistribution.value == 1
    )
    assert [c.value for c in CompressionType] == [c.value for c in Codec]
    assert allowed_spellings(ConsumerType) == ["Exclusive", "Shared", "Failover", "Key_Shared"]


def test_auto_split_means_one_thing() -> None:
    """The same words give the same selector for a subscription and for key_shared_assign."""
    assert isinstance(selector_for_mode("AUTO_SPLIT"), ConsistentHashingSelector)
    assert isinstance(selector_for_mode("AutoSplit"), ConsistentHashingSelector)
    assert isinstance(
        selector_for_mode("auto_split", use_consistent_hashing=False), AutoSplitHashRangeSelector
    )
    assert isinstance(selector_for_mode(KeySharedMode.Sticky), StickyHashRangeSelector)
    # key_shared_assign builds its selectors with selector_for_mode (checked against Spark
    # in test_spark_ops_key_shared); here: its mode parameter is this enum.
    import inspect

    from filepulsar.dispatch.spark import key_shared_assign

    sig = inspect.signature(key_shared_assign)
    assert sig.parameters["mode"].default is KeySharedMode.AutoSplit
    assert sig.parameters["use_consistent_hashing"].default is True


# ------------------------------------------------------------------------ entry: the client


def _sub_state(root: Path, topic: str, sub: str) -> Any:
    store = open_blob_store(str(root))
    return SubscriptionStore(store, TopicName.parse(topic), sub).latest()


@pytest.mark.parametrize(("member", "client_name", "wire"), SPELLINGS[ConsumerType])
def test_client_subscription_type_both_spellings(
    tmp_path: Path, member: ConsumerType, client_name: str, wire: str
) -> None:
    c = Client(str(tmp_path))
    try:
        for i, text in enumerate((client_name, wire.lower(), member)):
            cons = c.subscribe("t", f"s{i}", consumer_type=text)
            state = _sub_state(tmp_path, "t", f"s{i}")
            assert state.sub_type is member  # the member in memory, the wire name stored
            assert f'"type":"{wire}"'.encode() in state.encode()
            cons.close()
        with pytest.raises(InvalidConfiguration, match="consumer_type 'Sometimes' is not allowed"):
            c.subscribe("t", "bad", consumer_type="Sometimes")
    finally:
        c.close()


def test_client_initial_position_and_key_shared_mode_both_spellings(tmp_path: Path) -> None:
    c = Client(str(tmp_path))
    try:
        p = c.create_producer("t")
        p.send(b"first")
        for i, text in enumerate(("Earliest", "EARLIEST", InitialPosition.Earliest)):
            cons = c.subscribe("t", f"e{i}", initial_position=text)
            assert cons.receive(5000).data() == b"first"
            cons.close()
        for text in ("latest", "Latest"):
            cons = c.subscribe("t", f"l{text}", initial_position=text)
            with pytest.raises(Timeout):
                cons.receive(50)
            cons.close()
        for text in ("AUTO_SPLIT", "AutoSplit"):
            pol = ConsumerKeySharedPolicy(key_shared_mode=text)
            assert pol.key_shared_mode is KeySharedMode.AutoSplit
            cons = c.subscribe("t", f"k{text}", consumer_type="Key_Shared", key_shared_policy=pol)
            state = _sub_state(tmp_path, "t", f"k{text}")
            assert state.key_shared_mode is KeySharedMode.AutoSplit
            assert b'"keySharedMode":"AUTO_SPLIT"' in state.encode()
            cons.close()
        for text in ("STICKY", "Sticky", "sticky"):
            pol = ConsumerKeySharedPolicy(key_shared_mode=text, sticky_ranges=[(0, 65535)])
            assert pol.key_shared_mode is KeySharedMode.Sticky
        with pytest.raises(InvalidConfiguration, match="key_shared_mode 'Fixed' is not allowed"):
            ConsumerKeySharedPolicy(key_shared_mode="Fixed")
        with pytest.raises(InvalidConfiguration, match="initial_position 'Middle'"):
            c.subscribe("t", "bad", initial_position="Middle")
    finally:
        c.close()


PRODUCER_SETS = [
    ("message_routing_mode", PartitionsRoutingMode, "_routing_wire"),
    ("hashing_scheme", HashingScheme, "hashing_scheme"),
    ("batching_type", BatchingType, "batching_type"),
    ("compression_type", CompressionType, "codec"),
    ("access_mode", ProducerAccessMode, "access_mode"),
]


def _producer_setting(inner: Any, attr: str) -> str:
    if attr == "codec":
        return CompressionType(inner.codec.value).wire
    if attr == "_routing_wire":
        return f"{type(inner._routing.router).__name__}/custom={inner._routing.custom is not None}"
    value = getattr(inner, attr)
    assert isinstance(value, modes.Mode), (attr, value)  # the member, kept past the parser
    return value.wire


@pytest.mark.parametrize(
    ("param", "cls", "attr"), PRODUCER_SETS, ids=[p for p, _, _ in PRODUCER_SETS]
)
def test_client_producer_sets_both_spellings(
    tmp_path: Path, param: str, cls: type[modes.Mode], attr: str
) -> None:
    c = Client(str(tmp_path))
    try:
        settings: list[str] = []
        for n, (member, client_name, wire) in enumerate(SPELLINGS[cls]):
            seen = set()
            for i, text in enumerate((member, client_name, wire.lower())):
                extra: dict[str, Any] = {}
                if member is PartitionsRoutingMode.CustomPartition:
                    extra["message_router"] = lambda msg, n: 0
                if member is BatchingType.KeyBased:
                    extra["batching_enabled"] = True
                p = c.create_producer(
                    f"t-{param}-{n}-{i}", **{param: text}, **extra, producer_name=f"p{n}{i}"
                )
                seen.add(_producer_setting(p._inner, attr))
                p.close()
            assert len(seen) == 1, (member, seen)
            settings.append(seen.pop())
            if attr != "_routing_wire":
                assert settings[-1] == wire
        assert len(set(settings)) == len(settings)  # every member took effect differently
        with pytest.raises(InvalidConfiguration, match=f"{param} 'Nonsense' is not allowed"):
            c.create_producer("bad", **{param: "Nonsense"})
    finally:
        c.close()


# ------------------------------------------------------------------------ entry: Spark options


def _source(**opts: str) -> SourceOptions:
    return SourceOptions.parse({"path": "/tmp/x", "topic": "t", **opts}, streaming=True)


@pytest.mark.parametrize(
    ("option", "cls", "field", "extra"),
    [
        ("subscriptionType", ConsumerType, "subscription_type", {}),
        ("subscriptionInitialPosition", InitialPosition, "initial_position", {}),
        ("keySharedMode", KeySharedMode, "key_shared_mode", {"stickyHashRanges": "0-65535"}),
    ],
)
def test_source_options_both_spellings(
    option: str, cls: type[modes.Mode], field: str, extra: dict[str, str]
) -> None:
    for member, client_name, wire in SPELLINGS[cls]:
        for text in (client_name, wire, wire.lower(), client_name.upper()):
            o = _source(subscription="s", **{option: text}, **extra)
            assert getattr(o, field) is member, text
    with pytest.raises(InvalidConfiguration) as e:
        _source(subscription="s", **{option: "Nonsense"})
    msg = str(e.value)
    assert "\n" not in msg and f"option '{option}' is 'Nonsense'; allowed: " in msg
    assert ", ".join(allowed_spellings(cls)) in msg


@pytest.mark.parametrize(
    ("option", "cls", "field"),
    [
        ("messageRoutingMode", PartitionsRoutingMode, "routing_mode"),
        ("hashingScheme", HashingScheme, "hashing_scheme"),
        ("batchingType", BatchingType, "batching_type"),
        ("compressionType", CompressionType, "codec"),
    ],
)
def test_sink_options_both_spellings(option: str, cls: type[modes.Mode], field: str) -> None:
    for member, client_name, wire in SPELLINGS[cls]:
        for text in (client_name, wire, wire.lower(), client_name.upper()):
            cfg = parse_options({"path": "/tmp/x", "topic": "t", option: text})
            got = getattr(cfg, field)
            if field == "codec":
                assert got == Codec(member.value), text
            else:
                assert got is member, text
    with pytest.raises(InvalidConfiguration) as e:
        parse_options({"path": "/tmp/x", "topic": "t", option: "Nonsense"})
    msg = str(e.value)
    assert "\n" not in msg and f"option '{option}' is 'Nonsense'; allowed: " in msg
    assert ", ".join(allowed_spellings(cls)) in msg


# ------------------------------------------------------------------------ entry: the CLI


def test_cli_subscription_type_and_position_both_spellings(tmp_path: Path, capsys: Any) -> None:
    root = str(tmp_path)
    assert main(["--root", root, "produce", "t", "a", "b"]) == 0
    capsys.readouterr()
    for n, (member, client_name, wire) in enumerate(SPELLINGS[ConsumerType]):
        for i, text in enumerate((client_name, wire, wire.lower())):
            sub = f"s{n}{i}"
            pos = ("Earliest", "earliest", "EARLIEST")[i]
            code = main(["--root", root, "consume", "t", "-s", sub, "-t", text, "-p", pos])
            assert code == 0, capsys.readouterr().err
            assert capsys.readouterr().out == "a\n"  # from the earliest message
            assert _sub_state(tmp_path, "t", sub).sub_type is member
    for flag, value, what in (
        ("-t", "Sometimes", "-t/--subscription-type"),
        ("-p", "Middle", "-p/--subscription-position"),
    ):
        code = main(["--root", root, "consume", "t", "-s", "x", flag, value])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1
        assert err.startswith(f"error: {what} '{value}' is not allowed: use one of ")
    for text, expect in (("earliest", "a"), ("Earliest", "a"), ("LATEST", "b"), ("Latest", "b")):
        code = main(
            ["--root", root, "--output", "json", "topics", "examine-message", "t", "-i", text]
        )
        out = capsys.readouterr().out
        assert code == 0 and json.loads(out)["value"] == expect, (text, out)
    code = main(["--root", root, "topics", "examine-message", "t", "-i", "middle"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: -i/--initialPosition 'middle' is not allowed")
