"""The step's name, in a module of its own: every part names its errors with it, and the package
imports the parts."""

NAME = "guest.ssh_mesh"
