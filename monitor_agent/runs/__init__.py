"""A run's own facts, apart from the path records take: its lifecycle (runs/lifecycle.py)."""
