"""gpuwatt collector: NVML -> sample -> durable spool -> store. Runs on every GPU node."""
