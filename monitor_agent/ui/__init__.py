"""The web UI: runs page, run page, chart history and the HTML report."""
