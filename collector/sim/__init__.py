"""Simulated GPU cluster behind a fake NVML module."""
