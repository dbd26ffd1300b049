from gpuvm.desired.ssh import DesiredEsxi, DesiredGuest
