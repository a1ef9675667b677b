"""The client ``Consumer`` (:class:`~.facade.Consumer`) and the collaborators it owns, one
concept per module: :class:`~.topics.TopicSet`, :class:`~.receiver_queue.ReceiverQueue`,
:class:`~.ack_tracker.AckTracker`, :class:`~.dead_letters.DeadLetters`,
:class:`~.housekeeping.Housekeeping`, :class:`~.listener.Listener`, and the records they share
(:class:`~.records.Part`, :class:`~.records.Entry`).
"""

from filepulsar.connector.client.consumer.ack_tracker import AckTracker
from filepulsar.connector.client.consumer.dead_letters import DeadLetters
from filepulsar.connector.client.consumer.facade import Consumer
from filepulsar.connector.client.consumer.housekeeping import Housekeeping
from filepulsar.connector.client.consumer.listener import Listener
from filepulsar.connector.client.consumer.receiver_queue import ReceiverQueue
from filepulsar.connector.client.consumer.records import Entry, Part
from filepulsar.connector.client.consumer.topics import TopicSet

__all__ = [
    "AckTracker",
    "Consumer",
    "DeadLetters",
    "Entry",
    "Housekeeping",
    "Listener",
    "Part",
    "ReceiverQueue",
    "TopicSet",
]
