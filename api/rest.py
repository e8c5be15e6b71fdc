"""The scheduler's REST API as its clients speak it (fleet-rollout, hybctl): a bearer
token, the scheduler's CA, kept-alive connections, and its errors decoded.

The scheduler answers a refusal with ``{"error": {"code", "field", "message"}}``
(scheduler/api/errors.py); ``ApiError`` carries those three and the HTTP status, so a
client can name the field at fault and branch on the code. No answer at all (refused
connection, timeout, a TLS certificate that does not match) or a 5xx is
``ApiUnreachable``: worth asking again, and never the caller's fault.

A request the scheduler shed (503 ``hyb.scheduler.overloaded``: nothing was done, come
back after ``Retry-After``) is sent again after that wait and up to ``RETRY_AFTER_JITTER``
more, at most ``SHED_RETRIES`` times, each wait at most ``SHED_WAIT_MAX_S``: an operator's
command goes through a replica's short overload instead of failing on it."""

from __future__ import annotations

import email.utils
import random
import ssl
import time
from pathlib import Path
from typing import Any

import httpx

from api.bounds import RETRY_AFTER_JITTER

SHED_CODE = "hyb.scheduler.overloaded"  # scheduler/service/shed.py: refused before anything was done
SHED_RETRIES = 4
SHED_WAIT_MAX_S = 10.0


class ApiError(Exception):
    """The scheduler refused: ``code`` is its hyb.* code ("" if it gave none), ``field``
    the request field at fault ("" if none), ``status`` the HTTP status (0: no answer)."""

    def __init__(self, message: str, code: str = "", *, field: str = "", status: int = 0, reason: str = "",
                 url: str = ""):
        super().__init__(message)
        self.code, self.field, self.status, self.url = code, field, status, url
        self.reason = reason or message  # the scheduler's own words, without the request named


class ApiUnreachable(ApiError):
    """No answer, or a 5xx (a replica going away, the scheduler's database failing)."""


def tls_trust(ca: Path | None) -> ssl.SSLContext | bool:
    """What the client verifies the scheduler's certificate against: ``ca``, else the
    system's roots."""
    return ssl.create_default_context(cafile=str(ca)) if ca else True


def retry_after(r: httpx.Response, *, now: float | None = None) -> float | None:
    """A response's ``Retry-After`` in seconds (delay-seconds or an HTTP date), None when
    it has none or it does not parse."""
    v = r.headers.get("retry-after")
    if not v:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(v).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def shed_wait(r: httpx.Response, rng: random.Random | None = None) -> float | None:
    """How long to wait before sending ``r``'s request again, where the scheduler shed it
    (503 ``hyb.scheduler.overloaded`` with a Retry-After: it did nothing); else None. Any
    other 5xx may have done something, and is the caller's to judge."""
    if r.status_code != 503:
        return None
    later = retry_after(r)
    if later is None:
        return None
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    if code != SHED_CODE:
        return None
    return min(later, SHED_WAIT_MAX_S) * (1 + (rng or random).uniform(0, RETRY_AFTER_JITTER))


def describe_transport_error(e: httpx.HTTPError) -> str:
    """One line an operator can act on, for an error with no HTTP answer."""
    text = str(e) or type(e).__name__
    if "CERTIFICATE_VERIFY_FAILED" in text or "hostname" in text.lower() and "match" in text.lower():
        return f"TLS: the server's certificate is not trusted for this address ({text})"
    if isinstance(e, httpx.ConnectError):
        return f"cannot connect ({text})"
    if isinstance(e, httpx.TimeoutException):
        return f"no answer in time ({type(e).__name__})"
    return text


class RestClient:
    """``request`` returns the answer's JSON ({} for an empty body). ``http``: a client
    to use instead of one made from ``url`` and ``token`` (an in-process scheduler)."""

    def __init__(self, url: str, token: str, *, ca: Path | None = None, timeout_s: float = 10.0,
                 connections: int = 20, http: httpx.Client | None = None):
        # one kept-alive connection per request in flight: httpx keeps 20 by default, and
        # every call beyond that paid a TLS handshake (py-spy: a tenth of fleet-rollout's
        # CPU at 60 hosts in flight)
        self.url = url
        self.http = http or httpx.Client(base_url=url, verify=tls_trust(ca), timeout=timeout_s,
                                         limits=httpx.Limits(max_connections=None,
                                                             max_keepalive_connections=max(20, connections)))
        self.http.headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "RestClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """The raw answer, whatever its status; ApiUnreachable when there is none. A shed
        request is sent again (the module's docstring)."""
        retries = 0
        while True:
            try:
                r = self.http.request(method, path, **kw)
            except httpx.HTTPError as e:
                raise ApiUnreachable(f"scheduler {method} {path}: {describe_transport_error(e)}",
                                     url=self.url) from None
            wait = shed_wait(r)
            if wait is None or retries == SHED_RETRIES:
                return r
            retries += 1
            time.sleep(wait)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        r = self.send(method, path, **kw)
        if r.status_code >= 400:
            raise error_of(r, f"scheduler {method} {path}")
        return r.json() if r.content else {}

    def every_page(self, path: str, params: dict[str, Any] | None = None, *, limit: int = 500) -> list[Any]:
        """Every item of a paged list (``/v1/vms``, ``/v1/hosts``): pages of ``limit``,
        each asked ``after`` the ``next`` the one before gave."""
        items: list[Any] = []
        after = ""
        while True:
            page = self.request("GET", path, params={**(params or {}), "limit": limit,
                                                     **({"after": after} if after else {})})
            items += page["items"]
            after = page.get("next") or ""
            if not after:
                return items


def error_of(r: httpx.Response, what: str) -> ApiError:
    """The refusal in ``r`` (status >= 400) as an ApiError naming ``what`` was asked."""
    code, field, reason = "", "", ""
    try:
        err = r.json().get("error") or {}
        code, field, reason = str(err.get("code", "")), str(err.get("field") or ""), str(err.get("message", ""))
    except (ValueError, AttributeError):
        reason = r.text[:200]
    where = f" [{field}]" if field else ""
    message = f"{what}: {code or r.status_code}{where}: {reason or r.reason_phrase}"
    cls = ApiUnreachable if r.status_code >= 500 else ApiError
    return cls(message, code, field=field, status=r.status_code, reason=reason or r.reason_phrase)
