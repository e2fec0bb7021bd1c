"""The operator's in-memory view of the cluster, fed by watch events; no I/O.

`cluster.Cluster` is the read-only façade workers and decisions get; its parts (a store per
kind, device indexes, capacity and best fit, budgets' and pods' use, VMIs) are its own, and
only the door, runtime.view, changes them. Below `decisions`, above `api`.
"""
