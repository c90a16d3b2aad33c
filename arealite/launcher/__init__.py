"""Launchers: start inference servers and trainer processes, supervise them, stop them.

`local` runs everything on this machine, `ray` on a Ray cluster, `slurm` through sbatch.
All three build server command lines with `server_cmd` and share the restart policy in
`supervision`. Nothing here imports model code (torch, transformers) or, at import time, ray.
"""
