"""cozy-gpu-operator: GPUs for KubeVirt virtual machines.

The public surface is the console script (`cozygpu`, see `cli`) and the API models
in `cozygpu.api`; everything else is private to the operator.
"""

__version__ = "0.1.0"
