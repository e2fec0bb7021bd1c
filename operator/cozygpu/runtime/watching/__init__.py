"""What feeds the view: lists and watches through the one door (runtime.view).

`informer` lists and watches one kind, `podwatch` the pods that hold GPU units (§12), `resync`
lists every kind again so the view agrees with the API (§6.4).
"""
