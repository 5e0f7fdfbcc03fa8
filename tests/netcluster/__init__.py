"""A fault-injection cluster on one machine: see README.md beside this file."""

from tests.netcluster.cluster import Cluster, unavailable
from tests.netcluster.names import Names

__all__ = ["Cluster", "Names", "unavailable"]
