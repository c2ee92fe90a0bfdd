"""The base layer: errors, the console and the libraries' output, memory readings, which rank this process is
and how a run's processes end. It imports nothing else of the toolkit, and no torch."""
