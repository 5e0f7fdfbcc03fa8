"""Every Prometheus metric name the sidecar exposes, built in this one place.

Run metrics start with ``training_`` and carry the labels ``project``, ``run_id``, ``rank``
(per-layer ones add ``layer``). Other user labels of a run (``pod``, ``node``, ...) live on
``training_run_info`` so PromQL can join them (``* on(run_id) group_left(pod)``) without
multiplying every series. Self-metrics start with ``monitor_agent_``.

Dashboards, recording rules and alerting rules refer to these names; a test checks that
every name they use is one listed here.
"""

from __future__ import annotations

from dataclasses import dataclass

RUN_LABELS: tuple[str, ...] = ("project", "run_id", "rank")


@dataclass(frozen=True, slots=True)
class MetricName:
    name: str
    type: str  # gauge | counter | histogram | info
    help: str
    extra_labels: tuple[str, ...] = ()


def _g(name: str, help: str, *labels: str) -> MetricName:
    return MetricName(name, "gauge", help, labels)


def _c(name: str, help: str, *labels: str) -> MetricName:
    return MetricName(name, "counter", help, labels)


# Run metrics. The name of a counter omits `_total` here, as prometheus_client does;
# the exposition appends it.
LOSS = _g("training_loss", "Training loss of the latest step.")
LOSS_EMA = _g("training_loss_ema", "Bias-corrected EMA of the training loss.")
VAL_LOSS = _g("training_val_loss", "Latest validation loss.")
EVAL_TRAIN_LOSS = _g("training_eval_train_loss", "Mean training loss reported with the latest eval.")
EVAL_METRIC = _g("training_eval_metric", "Latest named eval score (accuracy, perplexity, ...).", "name")
CATEGORY_LOSS = _g("training_category_loss", "Latest eval loss per data category (eval metrics loss/<category>).", "category")
LEARNING_RATE = _g("training_learning_rate", "Learning rate of the first param group.")
GRAD_NORM = _g("training_grad_norm", "Global L2 gradient norm before clipping.")
CLIP_THRESHOLD = _g("training_grad_clip_threshold", "Max norm used for gradient clipping.")
PARAM_NORM = _g("training_param_norm", "Global L2 norm of the trainable parameters.")
UPDATE_NORM = _g("training_update_norm", "Global L2 norm of the last parameter update.")
UPDATE_RATIO = _g("training_update_ratio", "||update|| / ||param|| of the last step.")
EFFECTIVE_LR = _g("training_effective_learning_rate", "||update|| / ||clipped gradient|| of the latest layer-statistics step: the step the optimizer took per unit of gradient.")
TOKENS_PER_SECOND = _g("training_tokens_per_second", "Tokens per second of the latest step.")
MFU = _g("training_mfu_ratio", "Model FLOPs utilisation of the latest step (0..1).")
LOSS_SCALE = _g("training_loss_scale", "Mixed-precision loss scale.")
MEM_ALLOCATED = _g("training_memory_allocated_bytes", "Device memory allocated.")
MEM_RESERVED = _g("training_memory_reserved_bytes", "Device memory reserved by the allocator.")
MEM_PEAK = _g("training_memory_peak_allocated_bytes", "Peak device memory allocated.")
MEM_TOTAL = _g("training_memory_total_bytes", "Device memory total (or the stated budget).")
DATA_WAIT = _g("training_data_wait_seconds", "Seconds the latest step waited for its batch.")
COMPUTE_TIME = _g("training_compute_seconds", "This rank's own compute time of the latest step.")
SYNC_WAIT = _g("training_sync_wait_seconds", "Seconds the latest step waited on gradient all-reduce.")
GPU_UTIL = _g("training_gpu_utilization_ratio", "GPU utilisation (0..1) from NVML.")
GPU_TEMP = _g("training_gpu_temperature_celsius", "GPU temperature from NVML.")
GPU_POWER = _g("training_gpu_power_watts", "GPU power draw from NVML.")
GPU_POWER_LIMIT = _g("training_gpu_power_limit_watts", "GPU enforced power limit from NVML.")
GPU_SM_CLOCK = _g("training_gpu_sm_clock_mhz", "GPU SM clock from NVML.")
GPU_SM_CLOCK_MAX = _g("training_gpu_sm_clock_max_mhz", "GPU maximum SM clock from NVML.")
GPU_THROTTLE = _g("training_gpu_throttle", "1 while NVML reports the GPU's clocks held down "
                  "for this reason (thermal, power, hw_slowdown), else 0.", "reason")
GPU_ECC_ERRORS = _g("training_gpu_ecc_errors", "GPU ECC error count from NVML (error: "
                    "corrected|uncorrected; counter: volatile = since the driver loaded, "
                    "aggregate = the GPU's life).", "error", "counter")
GPU_REMAPPED_ROWS = _g("training_gpu_remapped_rows", "GPU memory rows remapped, by the error "
                       "kind that caused it (correctable|uncorrectable).", "kind")
GPU_REMAP_PENDING = _g("training_gpu_row_remap_pending", "1 while a row remap (or, before "
                       "Ampere, a page retirement) waits for a GPU reset.")
GPU_REMAP_FAILURE = _g("training_gpu_row_remap_failure", "1 once a row remap failed (no spare "
                       "rows left).")
GPU_PCIE_WIDTH = _g("training_gpu_pcie_link_width", "GPU PCIe link width (lanes) now.")
GPU_PCIE_WIDTH_MAX = _g("training_gpu_pcie_link_width_max", "GPU PCIe link width at most.")
GPU_PCIE_GEN = _g("training_gpu_pcie_link_generation", "GPU PCIe link generation now.")
GPU_PCIE_GEN_MAX = _g("training_gpu_pcie_link_generation_max", "GPU PCIe link generation at "
                      "most.")
GPU_XID_EVENTS = _g("training_gpu_xid_events", "XID critical-error events the client saw since "
                    "it started.")
GPU_LAST_XID = _g("training_gpu_last_xid", "The XID of the last XID event the client saw.")
GPU_LOST = _g("training_gpu_lost", "1 while NVML reports the GPU lost or needing a reset.")
LAST_STEP = _g("training_last_step", "Latest optimizer step received.")
LAST_STEP_TS = _g("training_last_step_timestamp_seconds", "Unix time of the latest step record.")
PROGRESS = _g("training_progress_ratio", "Fraction of total_steps (else total_tokens) done (0..1).")
LAST_CLEAN_CHECKPOINT = _g("training_last_clean_checkpoint_step", "Step of the run's last clean checkpoint (runs/checkpoint_ledger.py); absent when it has none.")
ETA = _g("training_eta_seconds", "Estimated seconds until total_steps (else total_tokens) is reached.")
STEP_DURATION = MetricName(
    "training_step_duration_seconds", "histogram", "Wall time of whole optimizer steps."
)
STEPS = _c("training_steps", "Optimizer steps received.")
TOKENS = _c("training_tokens", "Tokens consumed.")
SAMPLES = _c("training_samples", "Samples consumed.")
SKIPPED_STEPS = _c("training_skipped_steps", "Optimizer steps skipped (by the loss scaler or the client's step guard).")
SKIPPED_STEPS_BY_REASON = _c("training_skipped_steps_by_reason", "Optimizer steps skipped, by reason: nonfinite_grad, grad_norm_outlier (the client's step guard), loss_scale.", "reason")
FINDINGS = _c("training_findings", "Detector findings raised.", "type", "severity")
HUNG_RANKS = _g("training_hung_ranks", "Ranks the latest hang finding named stuck or gone "
                "(0 once each has stepped again).")
LAYER_GRAD_NORM = _g("training_layer_grad_norm", "Per-parameter gradient L2 norm.", "layer")
LAYER_EFFECTIVE_LR = _g("training_layer_effective_learning_rate", "Per-parameter ||update|| / ||clipped gradient||.", "layer")
LAYER_UPDATE_RATIO = _g("training_layer_update_ratio", "Per-parameter ||update|| / ||param||.", "layer")
LAYER_GRAD_ZERO = _g("training_layer_grad_zero_ratio", "Per-parameter fraction of exactly-zero gradient entries.", "layer")
LAYER_GRAD_QUANTILE = _g("training_layer_grad_quantile", "Per-parameter gradient quantile (pre-clip, sampled; q 0 and 1 are min and max) of the latest hist step.", "layer", "q")
LAYER_PARAM_QUANTILE = _g("training_layer_param_quantile", "Per-parameter weight quantile (sampled; q 0 and 1 are min and max) of the latest hist step.", "layer", "q")
ACT_MEAN = _g("training_activation_mean", "Mean of a module's output (latest monitored step).", "module")
ACT_STD = _g("training_activation_std", "Standard deviation of a module's output.", "module")
ACT_MAX_ABS = _g("training_activation_max_abs", "Largest absolute value of a module's output.", "module")
ACT_ZERO = _g("training_activation_zero_ratio", "Fraction of exactly-zero entries of a module's output.", "module")
ACT_DEAD = _g("training_activation_dead_ratio", "Fraction of a ReLU-family module's units zero for the whole batch.", "module")
ACT_NONFINITE = _g("training_activation_nonfinite", "NaN/Inf entries in a module's output.", "module")
# Where the run's time went (runs/goodput.py), exposed by the sidecar that judges the run
# (alone, or its leader), so fleet sums across sidecars count each run once.
GOODPUT_RATIO = _g("training_goodput_ratio", "Productive training time / wall-clock time since the run started (runs/goodput.py).")
PRODUCTIVE_SECONDS = _g("training_productive_seconds", "Wall-clock seconds of steps kept in the run's current history (a rollback takes its discarded steps back out).")
BADPUT_SECONDS = _c("training_badput_seconds", "Wall-clock seconds lost, by cause: startup, input (the device waiting for data), checkpoint, eval, hang_undetected, hang_detected, restart, rollback, resume, skipped, loss_scale, straggler_data, straggler_compute, straggler_collective (the straggler tax by what the straggler spends it on), unaccounted.", "cause")
STRAGGLER_SECONDS = _g("training_straggler_badput_seconds", "The straggler tax of the run's newest attempt that has one, by cause (straggler_data, straggler_compute, straggler_collective), naming the straggler: its rank and node ('' when its run record names none).", "cause", "rank", "node")
NODE_VERDICT = _g("training_node_verdict", "A node of a multi-node run that is not healthy (runs/node_verdict.py): 1 suspect, 2 sick, by cause class (gone, gpu-hardware, sdc-suspect, compute-slow, network-slow, input-slow); healthy nodes are not exposed, and at most 16 nodes a run are.", "node", "cause")
RUN_WALL_SECONDS = _g("training_run_wall_seconds", "Wall-clock seconds from the run's first record to its latest (attempts whose clocks overlap: each one's own): productive + every badput cause.")
RUN_GPUS = _g("training_run_gpus", "The ranks the run was seen stepping on (GPUs; CPU processes for a CPU-only run): its device-seconds are its seconds times this.")
# Meta's effective-training-time figures (runs/ettr.py), from the same ledger.
TIME_TO_START = _g("training_time_to_start_seconds", "The run's first attempt's start-up: its first record to its first step, less one typical step (runs/ettr.py).")
FAILURES = _c("training_failures", "Failures of the run's infrastructure: hangs and relaunches after a crash (a hang its relaunch ended counts once; rollbacks are not failures).")
TIME_TO_RECOVER = MetricName(
    "training_time_to_recover_seconds", "histogram",
    "Seconds from each recovered failure of the run to its first step after it (runs/ettr.py).")
ACTIONS = _c("training_actions", "Actions alert rules took for the run (stop, checkpoint, rollback).", "action", "rule")
RUN_INFO = MetricName(
    "training_run_info",
    "info",
    "Static facts of a run: user labels (pod, node, ...), status and verdict (healthy or "
    "unhealthy_<cause>); value 1.",
    ("status", "verdict"),
)
ALERTS_FIRING = _g("training_alerts_firing", "Alerts firing for the run.", "alertname", "severity")
ALERT_ACTIVE = _g(
    "training_alert_active",
    "1 per firing alert; labels carry what a table panel shows (summary, first suggestion).",
    "alertname", "severity", "layer", "summary", "suggestion",
)

STEP_DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
"""Training steps take milliseconds to minutes; the HTTP defaults stop at 10 s."""

# Self-metrics.
SELF_PREFIX = "monitor_agent_"
INGEST_REQUESTS = "monitor_agent_ingest_requests"  # counter, label code
INGEST_RECORDS = "monitor_agent_ingest_records"  # counter, label outcome
INGEST_REJECTIONS = "monitor_agent_ingest_rejections"  # counter, label reason
INGEST_DURATION = "monitor_agent_ingest_request_duration_seconds"  # histogram
STORE_DURATION = "monitor_agent_store_write_duration_seconds"  # histogram
DETECTOR_DURATION = "monitor_agent_detector_duration_seconds"  # histogram
RENDER_DURATION = "monitor_agent_metrics_render_duration_seconds"  # histogram
DROPPED_SERIES = "monitor_agent_dropped_series"  # counter, label reason
RUNS = "monitor_agent_runs"  # gauge, label state
READY = "monitor_agent_ready"  # gauge
BACKGROUND_SKIPPED = "monitor_agent_background_skipped"  # counter, label part
TICKS = "monitor_agent_ticks"  # counter
NOTIFICATIONS = "monitor_agent_notifications"  # counter, labels channel, outcome
NOTIFICATIONS_UNDELIVERED = "monitor_agent_notifications_undelivered"  # counter, channel, reason
NOTIFICATION_DURATION = "monitor_agent_notification_duration_seconds"  # histogram, channel
OUTBOX_PENDING = "monitor_agent_outbox_pending"  # gauge
OUTBOX_OLDEST_PENDING = "monitor_agent_outbox_oldest_pending_age_seconds"  # gauge, channel
NOTIFICATION_DEADLINE_EXCEEDED = "monitor_agent_notification_deadline_exceeded"  # counter, channel
ALERT_DECISIONS = "monitor_agent_alert_decisions"  # counter, label reason
BUILD_INFO = "monitor_agent_build_info"  # gauge 1, label version
# One run, one brain (monitor_agent/cluster): a node sidecar's link to its run leaders.
LEADER_EXCHANGES = "monitor_agent_leader_exchanges"  # counter, label outcome
UPLINK_QUEUED = "monitor_agent_uplink_queued"  # gauge: digests and findings owed to leaders
UPLINK_DROPPED = "monitor_agent_uplink_dropped"  # counter: step digests let go (cap)
UPLINK_BYTES = "monitor_agent_uplink_bytes"  # counter: bytes posted to leaders (gzip)
PEER_ITEMS = "monitor_agent_peer_items"  # counter, label kind: what leaders received
NODE_DRAINED = "monitor_agent_node_drained"  # gauge: 1 while a run's leader left this node out

RUN_METRICS: tuple[MetricName, ...] = tuple(
    v for v in globals().values() if isinstance(v, MetricName)
)
