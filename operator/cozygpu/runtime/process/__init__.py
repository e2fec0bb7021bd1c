"""The process: wiring, kopf's registration, health, leadership and supervision.

`app.Operator` builds the view, its door, the writer, the watches, the workers and the admission
path and starts them; `handlers` registers it with kopf; `health` serves /healthz, /readyz and
/metrics (`metrics_auth` guards it); `leadership` holds the Lease; `supervision` restarts a
worker that fails.
"""
