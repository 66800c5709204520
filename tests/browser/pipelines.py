"""Pipelines the browser tests upload through the dashboard's submit page."""

# Runs until cancelled: a slow generated stream printed by the driver once a second.
STREAMING = """\
def build(ctx):
    events = ctx.sources.datagen(seed=7, rows_per_second=5)
    return ctx.sinks.console(events, trigger="1 second")
"""

# An exception whose message is markup: the dashboard must show it as text.
EXCEPTION_PROBE = '<img id="exc-probe" src="x" onerror="window.__xss=3"><b id="exc-bold">bold</b>'
FAILING = f"""\
def build(ctx):
    raise RuntimeError({EXCEPTION_PROBE!r})
"""
