"""The operator's in-memory view of the cluster, fed by watch events.

`cluster.Cluster` holds every GPUClass, GPUDevice, GPUBudget, Node and Namespace
the operator has seen, with the secondary indexes decisions need (devices per
node, per namespace, per bind request). It does no I/O; the watch handlers and
the binder's own writes feed it. Below `decisions`, above `api`.
"""
