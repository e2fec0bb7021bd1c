"""The only door to the Kubernetes API: pykube-ng behind a small adapter.

`adapter.Kube` is synchronous (pykube uses requests); `adapter.AsyncKube` runs the
same calls in a worker thread for async callers, so nothing blocks the event loop.
"""
