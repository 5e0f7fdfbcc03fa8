"""The read side: what the API and the UI ask of runs (queries), answered as immutable
copies (views), and the live runs' state rendered for ``/metrics`` (exposition).

Nothing here writes run state; the write path (monitor_agent/pipeline) does not import it.
"""
