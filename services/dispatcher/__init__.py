"""The dispatcher: Headrace's REST API (Flink REST v1 paths and shapes) and web dashboard.

Stateless: it stores uploaded artifacts, writes submissions to the catalog, publishes
`SubmitJob`/`CancelJob` on the JobManager stream and answers everything else from the catalog.
Run it with `python -m services.dispatcher`.
"""
