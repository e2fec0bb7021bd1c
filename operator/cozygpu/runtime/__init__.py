"""The operator process, grouped by what each part does.

At the top, what every group shares: `view` (the one door into the cluster view), `writes` (the
one writer), `events` (Kubernetes Events) and `metrics`. Below, `watching` feeds the door,
`workers` decide and write, `admission` answers the API server's reviews, and `process` wires
them into one operator. Import-linter contracts keep the groups apart (pyproject.toml).
"""
