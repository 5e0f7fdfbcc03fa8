"""Storage: the one SQLite helper and its error type (database), runs/records/findings/
snapshots (store), and ``export``. No other package imports sqlite3 (tests/
test_architecture.py): alerting's database, the outbox and the chart history (history/)
open theirs through ``Database`` and name its ``Connection`` and ``Row``; everything
catches ``StorageError``.
"""
