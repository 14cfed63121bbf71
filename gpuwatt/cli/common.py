"""What the command line's commands share: exit statuses, the store URL, the spool folder."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from gpuwatt.config import Config, gpuwatt_home

EXIT_OK = 0
EXIT_INVALID = 1  # check-config found a problem
EXIT_ERROR = 2  # a command could not run

log = logging.getLogger("gpuwatt")


def load_scenario(name_or_path: str):
    from gpuwatt.collector.sim.scenario import load_scenario

    return load_scenario(name_or_path)


def store_url_of(args: argparse.Namespace, config: Config) -> str:
    from gpuwatt.store import default_store_url

    return args.store or config.store_url or default_store_url()


def spool_dir_of(args: argparse.Namespace, config: Config, name: str) -> Path:
    if getattr(args, "spool", None):
        return Path(args.spool)
    if config.collector.spool_dir is not None:
        return config.collector.spool_dir
    return gpuwatt_home(os.environ) / name


def display_url(url: str) -> str:
    return url.split("?", 1)[0]
