"""gpuwatt shared core: sample model, schema, config, GPU specs, stores, CLI."""

__version__ = "0.1.0"
