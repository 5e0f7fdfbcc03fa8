"""The run pipeline: records in (engine), the live runs (registry: each run's state and
detector suite as one object), durability (recovery, retention), and the read side the API,
the UI and replay query.
"""
