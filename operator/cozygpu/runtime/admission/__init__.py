"""The admission path (§3, §9, §12): the webhook server and what each hook decides with.

`webhooks` serves the reviews (TLS, a client CA, one table of hooks: api.hooks); `gate` hands each
to its executor: `vmi_webhook` (attach, request, wait, pin), `pod_webhook` (launchers), `validation`
(our kinds), with `reservations` and `waiters` for admissions in flight; `registration` and
`policy` put the webhooks and the no-bypass policy in place, and `guard` keeps the policy's
parameter current. They read the view and write through runtime.writes.
"""
