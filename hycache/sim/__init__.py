"""The simulator: hycache's real scheduler and cache driven by a cost model instead of a model.

Submodules: ``simulator`` (the loop: schedule, price the step, advance a virtual clock),
``costmodel`` (roofline step times, cache sizing), ``fit`` (the cost model fitted to measured
steps, device profiles), ``model_spec`` (the model description, ``ModelSpec.from_config`` of the
engine's model configs), ``presets`` (GPU specs and the JSON loaders of GPU and model presets),
``workloads`` (seeded synthetic requests and sessions), ``build`` (the one workload, config and
cost builder of simulate, bench and the load generator), ``trace`` / ``trace_gen`` / ``load``
(Mooncake-format traces: read, generate, offered load), ``tier`` (the second cache tier:
stand-in block payloads, a host store sized by them, link bandwidths), ``cluster`` (instances on
their own clocks and the router in front of them), ``compare`` (the arms of a comparison) and
``explain`` (`hycache explain`: where one request resumes under each policy).
"""
