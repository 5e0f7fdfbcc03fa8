"""A fault-injection cluster on one machine: see README.md beside this file."""

from netcluster.cluster import Cluster, unavailable
from netcluster.names import Names

__all__ = ["Cluster", "Names", "unavailable"]
