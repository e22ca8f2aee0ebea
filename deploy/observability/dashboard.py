"""The RoboCache Grafana dashboard, built with grafana-foundation-sdk.

    $ cd deploy/observability && python dashboard.py > grafana/dashboards/robocache.json

CI regenerates it and compares with the committed JSON, and checks that every query names a
metric RoboCache exports (tests/observability).
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import barchart, prometheus, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DynamicConfigValue,
    GridPos,
    VariableOption,
    VariableRefresh,
)

DATASOURCE = DataSourceRef(type_val="prometheus", uid="robocache-prometheus")
JOB = 'job=~"$job"'
RATE = "[$__rate_interval]"
STALL = (f"sum by (rank) (rate(robocache_loader_wait_seconds_sum{{{JOB}}}{RATE}))"
         f" / sum by (rank) (rate(robocache_loader_step_seconds_total{{{JOB}}}{RATE}) > 0)")


def query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return (prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
            .datasource(DATASOURCE))


def panel(kind, title: str, unit: str, pos: tuple[int, int, int, int],
          *targets: tuple[str, str], description: str = ""):
    """A panel of ``kind`` (timeseries / barchart module) at ``pos`` = (x, y, w, h)."""
    x, y, w, h = pos
    p = (kind.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
         .grid_pos(GridPos(x=x, y=y, w=w, h=h)))
    for i, (expr, legend) in enumerate(targets):
        p = p.with_target(query(expr, legend, chr(ord("A") + i)))
    return p


def per_dataset(*counters: tuple[str, str]) -> list[tuple[str, str]]:
    """(query, legend) of the per-dataset rate of each (counter, legend prefix)."""
    return [(f"sum by (dataset) (rate({c}{RATE}))", f"{legend} {{{{dataset}}}}")
            for c, legend in counters]


def build() -> dict:
    ts = timeseries
    panels = [
        panel(ts, "Data stall ratio per rank (worst rank in red)", "percentunit", (0, 0, 12, 8),
              (STALL, "rank {{rank}}"), (f"max({STALL})", "worst rank"),
              description="Fraction of the time between batch deliveries that the training "
                          "loop waited in next(loader). 0 = the GPU never waits for data.")
        .min(0).max(1)
        .override_by_name("worst rank", [
            DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "red"}),
            DynamicConfigValue("custom.lineWidth", 3)]),
        panel(ts, "Samples/s per rank", "none", (12, 0, 12, 8),
              (f"sum by (rank) (rate(robocache_loader_samples_total{{{JOB}}}{RATE}))",
               "rank {{rank}}")),
        panel(ts, "Batch wait p50 / p99", "s", (0, 8, 12, 8),
              *[(f"histogram_quantile({q}, sum by (le) "
                 f"(rate(robocache_loader_wait_seconds_bucket{{{JOB}}}{RATE})))", name)
                for q, name in ((0.5, "p50"), (0.99, "p99"))],
              description="Time the consumer waited for one batch."),
        panel(ts, "Time to first batch, prefetch depth", "s", (12, 8, 12, 8),
              (f"max by (rank) (robocache_loader_first_batch_seconds{{{JOB}}})",
               "first batch, rank {{rank}}"),
              (f"max by (rank) (robocache_loader_prefetch_depth{{{JOB}}})",
               "prefetch depth, rank {{rank}}"))
        .override_by_regexp("prefetch.*", [DynamicConfigValue("unit", "none"),
                                           DynamicConfigValue("custom.axisPlacement", "right")]),
        panel(ts, "Bytes/s vs the measured copy ceiling", "Bps", (0, 16, 12, 8),
              (f"sum(rate(robocache_loader_bytes_total{{{JOB}}}{RATE}))", "batches delivered"),
              (f"sum(rate(robocache_loader_h2d_bytes_total{{{JOB}}}{RATE}))", "host to device"),
              (f"sum(rate(robocache_op_bytes_total{{{JOB}}}{RATE}))", "op tensors"),
              (f"max(robocache_gpu_copy_ceiling_bytes_per_second{{{JOB}}})",
               "copy ceiling (robocache doctor)")),
        panel(ts, "GPU memory pressure", "percentunit", (12, 16, 12, 8),
              (f"max by (instance, gpu) (robocache_gpu_memory_used_bytes{{{JOB}}}"
               f" / robocache_gpu_memory_total_bytes{{{JOB}}})", "{{instance}} GPU {{gpu}} used"),
              (f"max by (instance, gpu) (robocache_gpu_torch_reserved_bytes{{{JOB}}}"
               f" / on (instance, gpu) robocache_gpu_memory_total_bytes{{{JOB}}})",
               "{{instance}} GPU {{gpu}} torch reserved"),
              (f"max by (instance, gpu) (robocache_gpu_utilization_ratio{{{JOB}}})",
               "{{instance}} GPU {{gpu}} utilisation"))
        .min(0).max(1),
        panel(ts, "Ingest: episodes/s", "none", (0, 24, 12, 8),
              *per_dataset(("robocache_ingest_episodes_cached_total", "cached"),
                           ("robocache_ingest_episodes_read_total", "read"))),
        panel(barchart, "Ingest: episodes quarantined by reason", "none", (12, 24, 12, 8),
              ("sum by (dataset, reason) "
               "(increase(robocache_ingest_episodes_quarantined_total[$__range]))",
               "{{dataset}} {{reason}}")),
        panel(ts, "Ingest: seconds per stage", "s", (0, 32, 12, 8),
              (f"sum by (stage) (rate(robocache_ingest_stage_seconds_sum{RATE}))", "{{stage}}"),
              description="Seconds spent per second of wall time in each stage "
                          "(read, align, write)."),
        panel(ts, "Ingest: bytes/s", "Bps", (12, 32, 12, 8),
              *per_dataset(("robocache_ingest_read_bytes_total", "read"),
                           ("robocache_ingest_written_bytes_total", "written"))),
        panel(ts, "Op calls/s", "none", (0, 40, 24, 8),
              (f"sum by (op) (rate(robocache_op_calls_total{{{JOB}}}{RATE}))", "{{op}}")),
    ]
    job = (QueryVariable("job").label("job").datasource(DATASOURCE)
           .query("label_values(robocache_build_info, job)").include_all(True).multi(True)
           .current(VariableOption(text="All", value="$__all"))
           .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))
    dash = (Dashboard("RoboCache").uid("robocache").tags(["robocache"]).timezone("utc")
            .refresh("10s").time("now-1h", "now").editable().with_variable(job))
    for p in panels:
        dash = dash.with_panel(p)
    return json.loads(json.dumps(dash.build(), cls=JSONEncoder))


if __name__ == "__main__":
    print(json.dumps(build(), indent=2, sort_keys=True))
