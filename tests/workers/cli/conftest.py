"""The inspection command is tested against real replication nodes: reuse the pubsub fixtures."""

from tests.pubsub.conftest import make_node, test_stream_db

__all__ = ["make_node", "test_stream_db"]
