"""Pure parsers from tool output to typed facts; one module per tool.

Each raises `gpuvm.errors.RemoteCommandError` naming the command and what it expected when
the text does not have the tool's format.
"""
