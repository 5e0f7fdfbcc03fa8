"""The write path: records and the clock in (engine, on its own thread: runner), the live
runs (registry: each run's state and detector suite as one object), what a request may bring
in (admission, plausible, layer_cap), a run id reused by a new process (attempts),
durability (recovery, retention, failpoints), and the engine run offline on trace files
(trace_judge).
"""
