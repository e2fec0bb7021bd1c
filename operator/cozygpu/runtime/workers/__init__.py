"""The workers: each keeps its own queue from the view's changes and writes through runtime.writes.

`binder` places devices and answers bind requests (§4, §5), `collector` releases and clears what
admissions and deleted VMIs leave (§6), `accountant` writes GPUNode and GPUBudget status (§8, §9).
They never know each other (an import-linter contract).
"""
