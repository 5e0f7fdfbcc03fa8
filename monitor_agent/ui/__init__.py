"""The web UI: the runs, run and compare pages and their static files."""
