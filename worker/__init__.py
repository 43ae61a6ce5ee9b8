"""Job execution: claims jobs from the ledger and runs the engine in child processes."""
