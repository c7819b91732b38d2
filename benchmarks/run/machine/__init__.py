"""The machine at hand: its GPUs through NVML, the preflight check, provenance, pace, the bandwidth probe."""
