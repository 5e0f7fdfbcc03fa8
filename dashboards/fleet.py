"""The "Fleet" dashboard: every run at a glance, and the sidecars' own health.

Example::

    board = build()   # the dict that dashboards/fleet.json holds
"""

from __future__ import annotations

from dashboards.board import dashboard, query_variable
from dashboards.panels import Grid, Json, override, stat, table, target, timeseries

UID = "monitor-agent-fleet"
P = 'project=~"$project"'
BY_RUN = "by (project, run_id)"
RUN_COLUMNS = {"project": "Project", "run_id": "Run", "status": "Status", "Value #B": "Step",
               "Value #C": "Progress", "Value #D": "Tokens/s", "Value #E": "Since last step",
               "Value #F": "Firing alerts", "Value #G": "ETA", "Value #H": "Goodput"}
RUN_LINK = ("/d/monitor-agent-training-run?var-run=${__value.raw}"
            "&var-project=${__data.fields.project}&${__url_time_range}")
UP = [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"},
                                    "1": {"text": "UP", "color": "green"}}}]


def variables() -> list[Json]:
    return [query_variable("project", "label_values(training_run_info, project)",
                           multi=True, all_=True)]


def runs(g: Grid) -> list[Json]:
    columns = [
        target(f"max by (project, run_id, status) (training_run_info{{{P}}})"),
        target(f"max {BY_RUN} (training_last_step{{{P}}})"),
        target(f"max {BY_RUN} (training_progress_ratio{{{P}}})"),
        target(f"sum {BY_RUN} (training_tokens_per_second{{{P}}})"),
        target(f"time() - max {BY_RUN} (training_last_step_timestamp_seconds{{{P}}})"),
        target(f"sum {BY_RUN} (training_alerts_firing{{{P}}})"),
        target(f"max {BY_RUN} (training_eta_seconds{{{P}}})"),
        target(f"max {BY_RUN} (training_goodput_ratio{{{P}}})"),
    ]
    units = [override("Progress", unit="percentunit"), override("Since last step", unit="s"),
             override("ETA", unit="s"), override("Goodput", unit="percentunit"),
             override("Tokens/s", unit="short"), override("Step", unit="none"),
             override("Firing alerts", unit="none"),
             override("Run", links=[{"title": "Open in Training run", "url": RUN_LINK}])]
    board = table("Runs", columns, columns=RUN_COLUMNS, hide=("Time", "Value #A"),
                  overrides=units, pos=g.place(18, 10),
                  description="Every run the sidecars hold, soonest done first (ETA from "
                  "total_steps or total_tokens); open one in the Training run dashboard.")
    board["options"]["sortBy"] = [{"displayName": "ETA", "desc": False}]
    return [
        g.row("Runs"),
        board,
        stat("Runs by status", [target(f"count by (status) (training_run_info{{{P}}})",
                                       "{{status}}", instant=True)],
             unit="none", pos=g.place(6, 10)),
        timeseries("Throughput per run", [
            target(f"project_run:training_tokens_per_second:sum{{{P}}}", "{{run_id}}")],
            unit="short", pos=g.place(12, 8), description="Tokens per second, all ranks."),
        timeseries("Step time p95 per run", [target(
            f"max {BY_RUN} (project_run_rank:training_step_duration_seconds:p95_rate5m{{{P}}})",
            "{{run_id}}")], unit="s", pos=g.place(12, 8)),
    ]


FLEET_GOODPUT = (f"sum(training_productive_seconds{{{P}}} * on(project, run_id) group_left "
                 f"training_run_gpus{{{P}}}) / sum(training_run_wall_seconds{{{P}}} "
                 f"* on(project, run_id) group_left training_run_gpus{{{P}}})")
BADPUT_GPU_HOURS = (f"sum by (cause) (training_badput_seconds_total{{{P}}} "
                    f"* on(project, run_id) group_left training_run_gpus{{{P}}}) / 3600")
# Meta's effective-training-time figures (runs/ettr.py): failures, time to start, and the
# time to recover over every run's recovered failures.
FAILURES = f"sum(training_failures_total{{{P}}})"
TIME_TO_START = f"avg(training_time_to_start_seconds{{{P}}})"


def recover(q: float) -> str:
    return (f"histogram_quantile({q}, sum by (le) "
            f"(training_time_to_recover_seconds_bucket{{{P}}}))")


STRAGGLER_GPU_HOURS = (f"training_straggler_badput_seconds{{{P}}} * on(project, run_id) "
                       f"group_left training_run_gpus{{{P}}} / 3600 > 0")
STRAGGLER_COLUMNS = {"project": "Project", "run_id": "Run", "cause": "Cause", "rank": "Rank",
                     "node": "Node", "Value": "GPU-hours"}


def goodput(g: Grid) -> list[Json]:
    """Where the fleet's GPU time went (runs/goodput.py): each run is exposed once, by
    the sidecar that judges it, so these sums over every sidecar count it once."""
    return [
        g.row("Goodput"),
        stat("Fleet goodput", [target(FLEET_GOODPUT, instant=True)], unit="percentunit",
             pos=g.place(6, 8), steps=[("red", None), ("orange", 0.9), ("green", 0.95)],
             description="Productive GPU-seconds over all GPU-seconds of every run held: "
             "steps kept in each run's history, weighted by its world size."),
        timeseries("Badput by cause (GPU-hours)", [target(BADPUT_GPU_HOURS, "{{cause}}")],
                   unit="short", pos=g.place(18, 8),
                   description="GPU-hours lost per cause, summed over runs: start-up, input "
                   "(the device waiting for data), checkpoints, eval, hangs, restarts, "
                   "rollbacks, skipped steps, and stragglers by what the straggler spends "
                   "the others' time on (straggler_data: its data loading; straggler_compute;"
                   " straggler_collective: late to the all-reduce). The same causes as the "
                   "findings: an input_bound run's time is input, a slow loader on one rank "
                   "is straggler_data."),
        table("Straggler tax by run", [target(STRAGGLER_GPU_HOURS, instant=True,
                                              fmt="table")],
              columns=STRAGGLER_COLUMNS, hide=("Time", "job", "instance"), pos=g.place(24, 6),
              overrides=[override("GPU-hours", unit="short")],
              description="Each run's straggler (its newest attempt with one): the rank, its "
              "node, and the GPU-hours it cost by what it spent them on."),
        stat("Failures", [target(FAILURES, instant=True)], unit="none", pos=g.place(6, 4),
             description="Hangs and relaunches after a crash over the runs held (a hang its "
             "relaunch ended counts once; rollbacks are not failures)."),
        stat("Time to start", [target(TIME_TO_START, instant=True)], unit="s",
             pos=g.place(6, 4), description="Mean first start-up of the runs held: first "
             "record to first step."),
        stat("Time to recover p50 / p99", [
            target(recover(0.5), "p50", instant=True),
            target(recover(0.99), "p99", instant=True)], unit="s",
             pos=g.place(12, 4), steps=[("green", None), ("orange", 60), ("red", 600)],
             description="From each failure to the first step after it, over every "
             "recovered failure of the runs held (the healing goal: 60 s)."),
    ]


def alerts(g: Grid) -> list[Json]:
    hide = ("Time", "__name__", "job", "instance", "Value")
    return [
        g.row("Alerts"),
        table("Sidecar alerts", [target(f"training_alert_active{{{P}}}")],
              columns={"severity": "Severity", "run_id": "Run", "alertname": "Alert",
                       "layer": "Layer", "summary": "Summary"},
              hide=(*hide, "project", "suggestion"), pos=g.place(14, 8),
              description="Findings the sidecars turned into alerts, on every run."),
        table("Prometheus alerts", [target('ALERTS{alertstate="firing"}')],
              columns={"severity": "Severity", "alertname": "Alert", "run_id": "Run",
                       "rank": "Rank", "instance": "Sidecar"},
              hide=("Time", "__name__", "job", "Value", "alertstate"), pos=g.place(10, 8),
              description="Sidecar down, stalled runs, stragglers, failing notifications."),
    ]


def sidecars(g: Grid) -> list[Json]:
    def rate(metric: str, by: str) -> str:
        return f"sum by ({by}) (rate({metric}[$__rate_interval]))"

    def p99(metric: str) -> str:
        return f"histogram_quantile(0.99, {rate(metric + '_bucket', 'instance, le')})"

    return [
        g.row("Sidecars"),
        stat("Sidecars", [target('up{job="monitor-agent"}', "{{instance}}", instant=True)],
             unit="none", mappings=UP, text_mode="value_and_name", pos=g.place(6, 6),
             steps=[("red", None), ("green", 1)]),
        timeseries("Records ingested per second", [target(
            rate("monitor_agent_ingest_records_total", "instance, outcome"),
            "{{instance}} {{outcome}}")], unit="short", pos=g.place(9, 6)),
        timeseries("Rejections per second", [target(
            rate("monitor_agent_ingest_rejections_total", "instance, reason"),
            "{{instance}} {{reason}}")], unit="short", pos=g.place(9, 6),
            description="Rejected records are lost; the sidecar logs the reason of each."),
        timeseries("Notifications per second", [target(
            rate("monitor_agent_notifications_total", "instance, channel, outcome"),
            "{{instance}} {{channel}} {{outcome}}")], unit="short", pos=g.place(8, 7),
            overrides=[override("failed", color={"mode": "fixed", "fixedColor": "red"})],
            description="Failed ones were given up after retries: those alerts reached nobody."),
        timeseries("Notification outbox", [target("monitor_agent_outbox_pending", "{{instance}}")],
                   unit="none", pos=g.place(8, 7)),
        timeseries("/metrics render and ingest latency p99", [
            target(p99("monitor_agent_metrics_render_duration_seconds"), "render {{instance}}"),
            target(p99("monitor_agent_ingest_request_duration_seconds"), "ingest {{instance}}"),
        ], unit="s", pos=g.place(8, 7)),
        timeseries("Runs held", [target("monitor_agent_runs", "{{instance}} {{state}}")],
                   unit="none", pos=g.place(12, 7)),
        timeseries("Series dropped by cardinality caps", [target(
            "sum by (instance, reason) (increase(monitor_agent_dropped_series_total"
            "[$__rate_interval]))", "{{instance}} {{reason}}")], unit="none", pos=g.place(12, 7)),
    ]


def build() -> Json:
    g = Grid()
    panels = [*runs(g), *goodput(g), *alerts(g), *sidecars(g)]
    return dashboard(UID, "Fleet", panels, variables(), annotations=[],
                     description="Every training run and every monitor-agent sidecar.")
