"""A fleet of hycache engines behind NVIDIA Dynamo's frontend and router (docs/fleet.md).

    card     the model directory Dynamo's frontend reads (config, tokenizer) for a preset
    worker   one engine as a Dynamo token-in worker (`hycache fleet worker`)
    router   hycache's exact router: each worker's own resume point, plus load
             (`hycache fleet router`)
    launch   starting and stopping a whole fleet on 127.0.0.1 (the tests, the benchmark)
    bench_setting  the fleet benchmark's setting, one home for the real fleet
             (`benchmarks/bench_fleet.py`) and the simulator's (`bench_fleet_sim.py`)

Dynamo (`ai-dynamo`, `ai-dynamo-runtime`) is imported only inside these modules' functions
that need it: the rest of hycache imports and runs without it.
"""
