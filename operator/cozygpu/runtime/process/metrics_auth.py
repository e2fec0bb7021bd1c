"""Who may read /metrics (§14.4): a caller whose bearer token the API server authenticates (TokenReview)
and allows `get` on the non-resource URL /metrics (SubjectAccessReview), as Kubernetes' own components and
controller-runtime's secure metrics do. The metrics name every tenant's namespaces, budgets and use.

Called by the health server per scrape. Answers are kept for a short while per token (hashed), in a
bounded table, so a scrape every few seconds costs the API server two calls a minute, and no stream of
made-up tokens grows the operator's memory. At most two callers are checked at once, and a caller who
finds both under way is answered 503 at once: a stream of made-up tokens costs the API client pool two
calls in flight, never the calls admissions and the binder wait on (§14.3). Callers allowed before (the
scraper) are kept apart, where no made-up token's answer evicts them, and checked again in a slot of
their own: a stream of made-up tokens cannot keep the scraper out (issue 34 item 6).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

import structlog

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, AsyncKube

log = structlog.get_logger("cozygpu.metrics")

PATH = "/metrics"
REMEMBERED = 1024  # tokens whose answer is kept
FOR = 60.0  # seconds an answer is kept
CHECKING = 2  # callers checked against the API server at once
ALLOWED = 64  # callers allowed before, kept apart from the rest


@dataclass(frozen=True)
class Verdict:
    status: int  # 200, 401 (who are you), 403 (not allowed), 503 (the API server did not answer)
    why: str = ""


class MetricsGuard:
    def __init__(self, kube: AsyncKube, *, remembered: int = REMEMBERED, keep_for: float = FOR) -> None:
        self._kube = kube
        self._answers: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()  # every other answer
        self._allowed: OrderedDict[str, float] = OrderedDict()  # callers allowed: until when the answer holds
        self._remembered, self._keep_for = remembered, keep_for
        self._checking = asyncio.Semaphore(CHECKING)
        self._rechecking = asyncio.Semaphore(1)  # for callers allowed before, whose answer ran out

    async def __call__(self, authorization: str | None) -> tuple[int, str]:
        """The health server's question: (status, why) for a request's Authorization header."""
        verdict = await self.check(authorization)
        return verdict.status, verdict.why

    async def check(self, authorization: str | None) -> Verdict:
        """The verdict for a request's Authorization header."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Verdict(401, "a bearer token is required for /metrics")
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        if self._allowed.get(key, 0.0) > time.monotonic():
            return Verdict(200)
        kept = self._answers.get(key)
        if kept is not None and kept[0] > time.monotonic():
            self._answers.move_to_end(key)
            return kept[1]
        slot = self._rechecking if key in self._allowed else self._checking
        if slot.locked():
            return Verdict(503, "busy checking other callers of /metrics; try again")
        async with slot:
            verdict = await self._ask(token.strip())
        if verdict.status == 200:
            self._answers.pop(key, None)
            self._allowed[key] = time.monotonic() + self._keep_for
            self._allowed.move_to_end(key)
            while len(self._allowed) > ALLOWED:
                self._allowed.popitem(last=False)
        elif verdict.status != 503:  # an API server that did not answer is asked again next time
            self._allowed.pop(key, None)
            self._answers[key] = (time.monotonic() + self._keep_for, verdict)
            self._answers.move_to_end(key)
            while len(self._answers) > self._remembered:
                self._answers.popitem(last=False)
        return verdict

    async def _ask(self, token: str) -> Verdict:
        review = {"apiVersion": kinds.TOKEN_REVIEW.api_version, "kind": "TokenReview", "spec": {"token": token}}
        try:
            answer = (await self._kube.create(kinds.TOKEN_REVIEW, review)).get("status") or {}
            if not answer.get("authenticated"):
                return Verdict(401, "the bearer token is not valid")
            user = answer.get("user") or {}
            access = {
                "apiVersion": kinds.SUBJECT_ACCESS_REVIEW.api_version,
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.get("username", ""),
                    "groups": user.get("groups") or [],
                    "uid": user.get("uid", ""),
                    "extra": user.get("extra") or {},
                    "nonResourceAttributes": {"path": PATH, "verb": "get"},
                },
            }
            allowed = (await self._kube.create(kinds.SUBJECT_ACCESS_REVIEW, access)).get("status") or {}
        except ApiError as e:
            log.warning("metrics.auth_failed", error=e.message)
            return Verdict(503, "the API server could not check the caller")
        if not allowed.get("allowed"):
            return Verdict(403, f"{user.get('username', '')} may not get {PATH}")
        return Verdict(200)
