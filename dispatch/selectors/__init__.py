"""Key_Shared consumer selectors: which consumer receives a message key.

A selector turns a message's sticky key (:func:`filepulsar.dispatch.hashing.sticky_key`) into a
*slot* of its hash range and the slot into a consumer. Pulsar has three selectors and filepulsar has
each with Pulsar's exact assignment rules:

* :class:`AutoSplitHashRangeSelector` -- ``AUTO_SPLIT`` with
  ``subscriptionKeySharedUseConsistentHashing=false``: one contiguous range per consumer, split in
  halves as consumers join.
* :class:`ConsistentHashingSelector` -- ``AUTO_SPLIT`` with consistent hashing (Pulsar's
  default): 100 points per consumer on a ring of slots.
* :class:`StickyHashRangeSelector` -- ``STICKY``: every consumer brings its own fixed ranges.

Consumers are identified by name. Every selector offers the scalar path (:meth:`select`,
:meth:`select_slot`) and a vectorised one (:meth:`select_slots`, :meth:`select_keys`) that answers
with indices into :meth:`consumers`. State round-trips through :meth:`to_dict` /
:func:`selector_from_dict` as plain JSON-compatible data, so a stateful Spark operator or a
subscription file can keep it; a restored selector behaves exactly like the original.

This module builds selectors (:func:`selector_for_mode`, :func:`selector_from_dict`); each selector
lives in its own module (:mod:`filepulsar.dispatch.selectors.auto_split`,
:mod:`filepulsar.dispatch.selectors.consistent`, :mod:`filepulsar.dispatch.selectors.sticky`) over
:mod:`filepulsar.dispatch.selectors.base`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from filepulsar.dispatch.modes import KeySharedMode
from filepulsar.dispatch.selectors.auto_split import AutoSplitHashRangeSelector
from filepulsar.dispatch.selectors.base import (
    DEFAULT_CONSISTENT_HASHING_POINTS,
    StickyKeyConsumerSelector,
)
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.dispatch.selectors.sticky import StickyHashRangeSelector

__all__ = ["selector_for_mode", "selector_from_dict"]

_KINDS: dict[str, type[StickyKeyConsumerSelector]] = {
    AutoSplitHashRangeSelector.kind: AutoSplitHashRangeSelector,
    ConsistentHashingSelector.kind: ConsistentHashingSelector,
    StickyHashRangeSelector.kind: StickyHashRangeSelector,
}


def selector_from_dict(state: Mapping[str, Any]) -> StickyKeyConsumerSelector:
    """Rebuild any selector from its :meth:`~StickyKeyConsumerSelector.to_dict` output.

    Raises
    ------
    ValueError
        If the kind is unknown or the state is invalid.
    """
    kind = state.get("kind") if isinstance(state, Mapping) else None
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown selector kind {kind!r}; expected one of {sorted(_KINDS)}")
    return cls.from_dict(state)


def selector_for_mode(
    key_shared_mode: KeySharedMode | str = "AUTO_SPLIT",
    *,
    use_consistent_hashing: bool = True,
    consistent_hashing_points: int = DEFAULT_CONSISTENT_HASHING_POINTS,
) -> StickyKeyConsumerSelector:
    """The selector Pulsar's broker builds for a Key_Shared subscription.

    Parameters
    ----------
    key_shared_mode
        ``"AUTO_SPLIT"`` (default) or ``"STICKY"``, in either spelling
        (:class:`filepulsar.dispatch.modes.KeySharedMode`).
    use_consistent_hashing
        Broker setting ``subscriptionKeySharedUseConsistentHashing`` (default true): whether
        ``AUTO_SPLIT`` uses consistent hashing or auto-split hash ranges.
    consistent_hashing_points
        ``subscriptionKeySharedConsistentHashingReplicaPoints`` (default 100).

    Raises
    ------
    ValueError
        If ``key_shared_mode`` is not one of the two modes (InvalidConfiguration).
    """
    if KeySharedMode.parse(key_shared_mode) is KeySharedMode.Sticky:
        return StickyHashRangeSelector()
    if use_consistent_hashing:
        return ConsistentHashingSelector(consistent_hashing_points)
    return AutoSplitHashRangeSelector()
