"""The SSH mesh between the cluster's guests (the `guest.ssh_mesh` step's parts).

- `key`: the cluster's one ed25519 key pair, kept in the state directory;
- `files`: what the mesh files hold (authorized_keys, known_hosts, the managed config block), pure;
- `guests`: the guests in the mesh, the mesh user on each, their verified host keys;
- `ssh_dir`: reading and writing a guest's ~/.ssh, one command each;
- `verify`: every ordered pair of guests logs in with the mesh key, checked pair by pair.

The step itself (observe / plan / apply) is `gpuvm.steps.guest_ssh_mesh`.
"""

NAME = "guest.ssh_mesh"  # the step's name: every change and error of the mesh carries it
