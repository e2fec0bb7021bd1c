"""The operator process: kopf handlers feeding the cluster view, and the executors.

`app.Operator` owns the cluster view, the binder and the node accountant; `handlers`
registers the thin kopf handlers that call it; `health` serves /healthz and /readyz.
"""
