"""The compile: the driver (a model to an artifact), the search loop over regions, the measurer,
the worker process that runs candidates, the progress display."""
