"""Storage: the one SQLite helper and its error type (database), runs/records/findings/
snapshots (store), and ``export``. Above it only the modules that own SQL import sqlite3
(alerting's schema and alert store, the outbox, the chart history in ui/; the list is in
tests/test_architecture.py); everything else catches ``StorageError``.
"""
