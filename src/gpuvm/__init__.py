"""gpuvm: vSphere GPU hosts → deep-learning cluster, with proof that it performs."""

__version__ = "0.1.0"
