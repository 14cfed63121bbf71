"""The command line: the only package that composes the services (collector, dashboard, alerts)."""

from gpuwatt.cli.main import main

__all__ = ["main"]
