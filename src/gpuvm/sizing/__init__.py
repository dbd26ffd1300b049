"""`gpuvm size`: GPU memory, GPU count, storage rate and epoch time for a training job, estimated
from tables with sources (tables.py) or from a measured run (measured.py)."""
