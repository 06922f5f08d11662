"""What-if analyses that never run the discrete-event simulation: TTL sweeps and storage
sizing, EPLB analysis, steady-state (offline) throughput and the published-deployment checks."""
