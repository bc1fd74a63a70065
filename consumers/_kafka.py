"""Small adjustments to aiokafka's clients that the materializer needs (imports aiokafka; import it
only when consuming)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from types import MethodType
from typing import Any

from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

log = logging.getLogger("callgate.materializer")


@dataclass
class MetadataWatch:
    """What the last metadata answer of one client said about the cluster."""

    cluster_id: str | None = None
    """The cluster id the broker answered with (None before the first answer, or from a broker whose
    metadata version carries none). The embedded broker starts a new cluster, with a new id, every
    time it starts, so a changed id means every log this client read is gone."""


def forbid_topic_creation(client: AIOKafkaClient) -> MetadataWatch:
    """Make `client` (a consumer's `_client`) ask for metadata without creating the topics it names,
    and return the `MetadataWatch` its answers update from now on.

    aiokafka 0.14 builds its metadata requests as `MetadataRequest(topics)`, whose version 4 and later
    default `allow_auto_topic_creation` to True, and offers no option to change it. A consumer would
    then create the topic it reads with the broker's default partition count whenever the topic is
    missing (the embedded broker after an empty restart, before a sink recreated it with the known
    count): the ghost partition of issue 14. This replaces the one method that builds the request, on
    this client only (other clients in the process keep aiokafka's behaviour); the body is aiokafka's
    own `_metadata_update` with the flag turned off. Revisit when aiokafka is upgraded (pinned <0.15).
    """
    watch = MetadataWatch()
    client._metadata_update = MethodType(_metadata_update_factory(watch), client)
    return watch


def _metadata_update_factory(watch: MetadataWatch) -> Any:
    async def _metadata_update(self: AIOKafkaClient, cluster_metadata: ClusterMetadata, topics: Any) -> bool:
        metadata_request = MetadataRequest(list(topics) if topics else None, allow_auto_topic_creation=False)
        nodeids: list[Any] = [b.nodeId for b in self.cluster.brokers()]
        bootstrap_id = ("bootstrap", ConnectionGroup.DEFAULT)
        if bootstrap_id in self._conns:
            nodeids.append("bootstrap")
        random.shuffle(nodeids)
        for node_id in nodeids:
            conn = await self._get_conn(node_id)
            if conn is None:
                continue
            try:
                metadata = await conn.send(metadata_request)
            except (KafkaError, TimeoutError) as err:
                log.debug("metadata request to node %s failed: %r", node_id, err)
                continue
            if not metadata.brokers:
                return False
            cluster_metadata.update_metadata(metadata)
            watch.cluster_id = getattr(metadata, "cluster_id", None) or watch.cluster_id
            if bootstrap_id in self._conns and len(self.cluster.brokers()):
                self._conns.pop(bootstrap_id).close()
            break
        else:
            log.debug("no broker answered a metadata request (%s)", nodeids)
            cluster_metadata.failed_update(None)
            return False
        return True

    return _metadata_update
