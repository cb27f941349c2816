"""What the benchmarks share: models and the server process, load generators, trials, CPU time, results files."""
