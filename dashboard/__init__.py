"""gpuwatt's web dashboard (Dash): load balance, stragglers, TFLOPS per watt, energy, CSV.

- ``dashboard.app.create_app(store, *, now_ns=None, config=None, credentials=None, alerts=None)``
  builds the app from an injected store (and clock).
- ``gpuwatt.dashboard.server.start(store, host, port, ...)`` serves it from a thread (``.url``,
  ``.stop()``); ``gpuwatt.dashboard.server.serve(store, host, port, stop_event)`` in the foreground.
  Both refuse a non-loopback address without credentials (``gpuwatt.dashboard.auth``).
- CSV: ``/download/report.csv`` and ``/download/series.csv`` (``gpuwatt.dashboard.csv_export``).

The dashboard reads the store and calls ``gpuwatt.analytics``; it never imports the collector or
the alert evaluator (``dashboard/ruff.toml``); alerts plug in through ``dashboard.alerts_hook``.
"""
