"""Benchmarks: `hycache bench`'s comparisons on the CPU engine and simulated (`suite`), its
eviction curves (`eviction`), the load generator of `hycache bench serve` (`loadgen`), the
figures they draw (`plots`), and the simulator's validation: `hycache calibrate` timing the
engine over step shapes (`calibrate`) and `bench --validate` running engine and simulator side
by side (`validate`). Their tables live in hycache.cli.tables."""
