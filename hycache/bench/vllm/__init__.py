"""hycache beside vLLM's real scheduler, with no model: the reference harness (`reference`:
vLLM 0.33 or 0.34's scheduler and KV cache manager, stock or with `hycache.vllm.Scheduler`),
the scenarios both sides replay (`scenario`) and `hycache explain --backend vllm` (`explain`).
Only the CLI, the benchmarks and the tests use them; a vLLM deployment imports the plugin,
`hycache.vllm`, alone."""
