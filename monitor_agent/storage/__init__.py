"""Storage: the one SQLite helper and its error type (database), runs/records/findings/
snapshots (store), and ``export``. Nothing above this package imports sqlite3.
"""
