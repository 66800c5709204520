"""Data plane of a TaskManager: the Spark driver process (`runner`), the `PipelineContext`
handed to pipelines, and the connectors (sources and sinks)."""
