"""Simulator: cost model, presets, workloads and traces (the simulator loop is ``simulator``).

Submodules: ``costmodel`` (roofline step times, cache sizing), ``presets`` (GPU and model
specs and their JSON loaders), ``workloads`` (seeded synthetic requests and sessions),
``trace`` (Mooncake-format traces: read, generate, write, measure).
"""
