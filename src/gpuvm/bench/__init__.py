"""Benchmarks: parse tool output into figures, keep results on disk, compare and report them.

Submodules are imported on demand (`gpuvm.bench.parsers`, `.results`, `.compare`, `.report`) so
that importing the package stays cheap for the CLI.
"""
