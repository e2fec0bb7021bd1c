"""The only door to the Kubernetes API: pykube-ng behind a small adapter.

`adapter.Kube` is synchronous (pykube uses requests); `adapter.ThreadedKube` runs the
same calls in a worker thread for async callers, so nothing blocks the event loop; they are
typed against `adapter.AsyncKube`, the protocol the unit tests' in-memory API satisfies too.
"""
