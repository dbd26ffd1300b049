"""`python -m gpuvm`: the gpuvm command."""

from gpuvm.cli.entry import main

main()
