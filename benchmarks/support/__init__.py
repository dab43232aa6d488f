"""What the end-to-end benchmarks share, and the processes they start."""
