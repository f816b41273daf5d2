"""The `hycache` command line: one module per sub-command (explain, simulate, generate, bench,
bench_serve, calibrate, serve, trace_gen), the registry and entry point (`main`), the flags
and typed arguments (`args`) and what is printed (`tables`)."""
