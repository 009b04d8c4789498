"""Benchmarks: the frontend's, the search's, a compiled artifact's and the GPU side by side with
PyTorch."""
