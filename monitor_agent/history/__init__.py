"""The chart history: a compact copy of the stored records that the charts read.

``schema`` (its database: the schema as migrations, ``open_history``), ``builder`` (a
record folded into its rows), ``blocks`` (the pre-aggregated levels a whole-run chart
reads), ``vectors`` (a per-layer vector's stored form), ``series`` (the downsampled reads)
and ``indexer`` (the thread that keeps it in step with the records). ``api/charts.py``
serves it; the report (tools/report.py) builds one from a trace.
"""
