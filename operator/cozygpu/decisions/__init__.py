"""Pure decisions: which node serves what, where a set goes, what a budget allows.

Everything here reads a `state.Cluster` (or plain models) and returns data: no
I/O, no clock unless passed in. The webhook and the binder call it; tests call it
directly. Modules: `selectors`, `capacity` (§8, §5.1), `placement` (§5.2-5.3),
`budgets` (§7), `nodestatus` (§1.3), `requests` (§4, the binder's side), `admission`
(§3) and `attach` (§4, the webhook's side), `lifecycle` (§6, what the collector does).
"""
