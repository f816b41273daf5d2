"""Simulator: cost model, presets, workloads and traces (the simulator loop is ``simulator``).

Submodules: ``costmodel`` (roofline step times, cache sizing), ``model_spec`` (the model
description, ``ModelSpec.from_config`` of the engine's model configs), ``presets`` (GPU specs
and the JSON loaders of GPU and model presets), ``workloads`` (seeded synthetic requests and
sessions), ``trace`` (Mooncake-format traces: read, generate, write, measure), ``tier`` (the
second cache tier: stand-in block payloads, a host store sized by them, link bandwidths),
``cluster`` (instances on their own clocks and the router in front of them).
"""
