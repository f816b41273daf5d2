"""Benchmarks: `hycache bench`'s comparisons on the CPU engine and simulated (`suite`), its
eviction curves (`eviction`), the load generator of `hycache bench serve` (`loadgen`) and the
figures they draw (`plots`). Their tables live in hycache.cli.tables."""
