"""Command-line tools: bench, loadtest, warm, parity, info and their reports. Imported only by the CLI."""
