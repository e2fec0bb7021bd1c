"""The tests' scaffolding, one module per concept; conftest.py files hold only the fixtures built on it.

`bodies`: objects as tenants and the platform write them. `views`: cluster views for unit tests.
`objects`: the tests' own hands on the API server. `seen`: waiting until the operator's view has an
object. `refusals`: what a refused admission says and leaves. `invariants`: what must hold after any
scenario. `nodes`, `operators`, `kubevirt`, `vms`, `tenants`, `webhooks`, `image`, `soak`: GPU nodes,
operator processes, KubeVirt in the loop, VMs, hostile tenants, second webhooks, the built image and
the reliability tier's tallies. `monitoring`: the chart's alert rules, dashboards and their queries.
`memkube`, `writing`, `workers`: an in-memory API and what the
writer's and the workers' fast unit tests build on it (in addition to the real-API tiers).
"""
