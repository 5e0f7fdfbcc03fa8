"""The "Training run" dashboard: one run's health, rank by rank.

Example::

    board = build()   # the dict that dashboards/training-run.json holds
"""

from __future__ import annotations

from dashboards.board import annotation, dashboard, query_variable
from dashboards.panels import (
    Grid,
    Json,
    heatmap,
    limit_line,
    regex_override,
    stat,
    table,
    target,
    timeseries,
)

UID = "monitor-agent-training-run"
RUN = 'project=~"$project", run_id="$run"'
SEL = RUN + ', rank=~"$rank"'
ALERT_COLUMNS = {"severity": "Severity", "alertname": "Alert", "rank": "Rank", "layer": "Layer",
                 "summary": "Summary", "suggestion": "Suggestion"}


def variables() -> list[Json]:
    return [
        query_variable("project", "label_values(training_run_info, project)", all_=True),
        query_variable("run", 'label_values(training_run_info{project=~"$project"}, run_id)'),
        query_variable("rank", f"label_values(training_last_step{{{RUN}}}, rank)",
                       multi=True, all_=True),
    ]


def annotations() -> list[Json]:
    return [
        annotation("Findings", "sum by (type, severity) (increase(training_findings_total"
                   f"{{{RUN}}}[$__rate_interval])) > 0",
                   title="{{type}}", text="{{severity}} finding", color="orange"),
        annotation("Sidecar alerts", f"training_alert_active{{{RUN}}}",
                   title="{{alertname}}", text="{{summary}}", color="red"),
        annotation("Prometheus alerts", f'ALERTS{{alertstate="firing", {RUN}}}',
                   title="{{alertname}}", text="{{alertname}} ({{severity}})", color="purple"),
    ]


def overview(g: Grid) -> list[Json]:
    age = f"time() - max(training_last_step_timestamp_seconds{{{RUN}}})"
    return [
        g.row("Overview"),
        stat("Status", [target(f"training_run_info{{{RUN}}}", "{{status}}", instant=True)],
             unit="none", text_mode="name", pos=g.place(4, 4)),
        stat("Step", [target(f"max(training_last_step{{{RUN}}})", instant=True)],
             unit="none", pos=g.place(4, 4)),
        stat("Progress", [target(f"max(training_progress_ratio{{{RUN}}})", instant=True)],
             unit="percentunit", pos=g.place(4, 4),
             description="Steps done of config.total_steps."),
        stat("ETA", [target(f"max(training_eta_seconds{{{RUN}}})", instant=True)],
             unit="s", pos=g.place(4, 4)),
        stat("Since last step", [target(age, instant=True)], unit="s", pos=g.place(4, 4),
             steps=[("green", None), ("orange", 300), ("red", 600)],
             description="Prometheus alerts TrainingRunStalled after 20 mean steps (10 min at least)."),
        stat("Firing alerts", [target(f"sum(training_alerts_firing{{{RUN}}})", instant=True)],
             unit="none", no_value="0", pos=g.place(4, 4),
             steps=[("green", None), ("red", 1)]),
    ]


def loss_and_gradients(g: Grid) -> list[Json]:
    return [
        g.row("Loss and optimisation"),
        timeseries("Loss", [
            target(f"training_loss{{{SEL}}}", "loss rank {{rank}}"),
            target(f"training_loss_ema{{{SEL}}}", "EMA rank {{rank}}"),
            target(f"training_val_loss{{{SEL}}}", "val loss rank {{rank}}"),
        ], unit="none", pos=g.place(12, 8),
            description="Training loss, its bias-corrected EMA, and the latest validation loss."),
        timeseries("Learning rate", [target(f"training_learning_rate{{{SEL}}}", "rank {{rank}}")],
                   unit="sci", pos=g.place(6, 8)),
        timeseries("Effective learning rate", [
            target(f"training_effective_learning_rate{{{SEL}}}", "effective rank {{rank}}"),
            target(f"training_learning_rate{{{SEL}}}", "nominal rank {{rank}}"),
        ], unit="sci", log=10, pos=g.place(6, 8),
            description="||update|| / ||clipped gradient|| (layer-statistics steps) beside the "
                        "nominal lr: equal for plain SGD; Adam's is lr over the gradient's "
                        "scale. A sudden gap that stays is the optimizer amplifying or damping "
                        "(warning effective_lr_shift)."),
        timeseries("Gradient norm (before clipping)", [
            target(f"training_grad_norm{{{SEL}}}", "grad norm rank {{rank}}"),
            target(f"max(training_grad_clip_threshold{{{SEL}}})", "clip threshold"),
        ], unit="none", log=10, pos=g.place(12, 8), overrides=[limit_line("clip threshold")],
            description="Above the dashed line the step was clipped; clipped on most steps "
                        "means the threshold or the learning rate is off."),
        timeseries("Update ratio ||update|| / ||param||", [
            target(f"training_update_ratio{{{SEL}}}", "rank {{rank}}"),
        ], unit="sci", log=10, pos=g.place(12, 8),
            band=[("red", None), ("orange", 1e-7), ("green", 1e-4), ("orange", 1e-2), ("red", 1e-1)],
            description="Green is the healthy band (1e-4 to 1e-2, about 1e-3 typical). "
                        "Below 1e-7 the run is not learning; above 1e-1 it is unstable."),
    ]


def throughput(g: Grid) -> list[Json]:
    buckets = f"sum by (le) (increase(training_step_duration_seconds_bucket{{{SEL}}}[$__rate_interval]))"
    breakdown = [
        target(f"project_run_rank:training_step_duration_seconds:p50_rate5m{{{SEL}}}", "p50 step rank {{rank}}"),
        target(f"project_run_rank:training_step_duration_seconds:p95_rate5m{{{SEL}}}", "p95 step rank {{rank}}"),
        target(f"training_data_wait_seconds{{{SEL}}}", "data wait rank {{rank}}"),
        target(f"training_compute_seconds{{{SEL}}}", "compute rank {{rank}}"),
        target(f"training_sync_wait_seconds{{{SEL}}}", "all-reduce wait rank {{rank}}"),
    ]
    return [
        g.row("Throughput"),
        timeseries("Tokens per second", [
            target(f"training_tokens_per_second{{{SEL}}}", "rank {{rank}}"),
            target(f"sum(rate(training_tokens_total{{{RUN}}}[$__rate_interval]))", "all ranks"),
        ], unit="short", pos=g.place(8, 8)),
        timeseries("MFU", [target(f"training_mfu_ratio{{{SEL}}}", "rank {{rank}}")],
                   unit="percentunit", min_=0, pos=g.place(8, 8),
                   description="Model FLOPs utilisation against the device's peak."),
        heatmap("Step time", [target(buckets, "{{le}}", fmt="heatmap")],
                      unit="short", y_unit="s", scheme="Oranges", pos=g.place(8, 8),
                      description="Steps per step-time bucket, from the histogram."),
        timeseries("Where a step's time goes", breakdown, unit="s", pos=g.place(12, 8),
                   description="A straggler rank shows high compute; the others then show "
                               "high all-reduce wait."),
        timeseries("Loss scale and skipped steps", [
            target(f"training_loss_scale{{{SEL}}}", "loss scale rank {{rank}}"),
            target(f"increase(training_skipped_steps_total{{{SEL}}}[$__rate_interval])",
                   "skipped rank {{rank}}"),
        ], unit="short", log=2, pos=g.place(12, 8), overrides=[
            regex_override("skipped.*", custom__axisPlacement="right", custom__drawStyle="bars")],
            description="Mixed precision: a scale falling step after step is loss-scale collapse."),
    ]


def device(g: Grid) -> list[Json]:
    return [
        g.row("Memory and device"),
        timeseries("Memory", [
            target(f"training_memory_allocated_bytes{{{SEL}}}", "allocated rank {{rank}}"),
            target(f"training_memory_reserved_bytes{{{SEL}}}", "reserved rank {{rank}}"),
            target(f"training_memory_peak_allocated_bytes{{{SEL}}}", "peak rank {{rank}}"),
            target(f"max(training_memory_total_bytes{{{SEL}}})", "total"),
        ], unit="bytes", min_=0, pos=g.place(12, 8), overrides=[limit_line("total")]),
        timeseries("GPU utilisation", [
            target(f"training_gpu_utilization_ratio{{{SEL}}}", "rank {{rank}}")],
            unit="percentunit", min_=0, max_=1, pos=g.place(4, 8)),
        timeseries("GPU temperature", [
            target(f"training_gpu_temperature_celsius{{{SEL}}}", "rank {{rank}}")],
            unit="celsius", pos=g.place(4, 8)),
        timeseries("GPU power", [target(f"training_gpu_power_watts{{{SEL}}}", "rank {{rank}}")],
                   unit="watt", pos=g.place(4, 8)),
    ]


def evaluation(g: Grid) -> list[Json]:
    return [
        g.row("Evaluation"),
        timeseries("Train and validation loss at evals", [
            target(f"training_eval_train_loss{{{SEL}}}", "train rank {{rank}}"),
            target(f"training_val_loss{{{SEL}}}", "val rank {{rank}}"),
            target(f"training_val_loss{{{SEL}}} - training_eval_train_loss{{{SEL}}}",
                   "gap rank {{rank}}"),
        ], unit="none", pos=g.place(12, 8),
            description="A gap that keeps widening while train loss falls is overfitting."),
        timeseries("Eval metrics", [
            target(f"training_eval_metric{{{SEL}}}", "{{name}} rank {{rank}}")],
            unit="none", pos=g.place(12, 8)),
        timeseries("Eval loss by category", [
            target(f"training_category_loss{{{SEL}}}", "{{category}} rank {{rank}}")],
            unit="none", pos=g.place(12, 8),
            description="Per-category eval loss (each sample weighted once). One line turning "
                        "up while the others fall: category_divergence (that data changed, "
                        "or the model is forgetting it)."),
        timeseries("Category loss relative to the median category", [
            target(f"training_category_loss{{{SEL}}} / on (project, run_id, rank) group_left "
                   f"quantile by (project, run_id, rank) (0.5, training_category_loss{{{SEL}}})",
                   "{{category}} rank {{rank}}")],
            unit="none", log=2, pos=g.place(12, 8),
            description="Scale-free view of the same: a category drifting away from 1x is "
                        "diverging from the rest."),
    ]


def alerts(g: Grid) -> list[Json]:
    return [
        g.row("Alerts and findings"),
        table("Active alerts", [target(f"training_alert_active{{{RUN}}}")],
              columns=ALERT_COLUMNS, pos=g.place(24, 8),
              hide=("Time", "__name__", "job", "instance", "project", "run_id", "Value"),
              description="What the sidecar is alerting on now, with its first suggestion."),
        timeseries("Findings so far by type", [
            target(f"sum by (type, severity) (training_findings_total{{{RUN}}})",
                   "{{type}} ({{severity}})")], unit="short", pos=g.place(12, 8)),
        table("Prometheus alerts", [target(f"ALERTS{{{RUN}}}")],
              columns={"alertstate": "State", "alertname": "Alert", "severity": "Severity",
                       "rank": "Rank"},
              hide=("Time", "__name__", "job", "instance", "project", "run_id", "Value"),
              pos=g.place(12, 8),
              description="Stalled run and straggler rank: what Prometheus sees across nodes."),
    ]


def build() -> Json:
    g = Grid()
    panels = [*overview(g), *alerts(g), *loss_and_gradients(g), *throughput(g), *device(g),
              *evaluation(g)]
    return dashboard(UID, "Training run", panels, variables(), annotations=annotations(),
                     description="One run of monitor-agent: loss, gradients, throughput, "
                                 "memory, evals, alerts.")
