"""The console's security headers, on every response under /ui: its pages, redirects,
static files and error pages, and the refusals answered before any route (a dot segment,
a body over the limit). Applied where a response starts (``wrap(scope, send)``, from the
application's entry), so no path through the console can leave them out.

- ``Content-Security-Policy``: scripts and styles from this server only (no inline
  script, no ``eval``: htmx is told not to); frames, plugins and ``<base>`` refused; forms
  post only here; ``frame-ancestors 'none'`` with ``X-Frame-Options: DENY`` for older
  browsers. Inline ``style`` attributes are allowed (``style-src-attr``), not ``<style>``
  elements: ECharts writes its tooltips as HTML with style attributes.
- ``X-Content-Type-Options: nosniff``.
- ``Referrer-Policy: same-origin``: no console URL (a host name, a filter) leaves for
  another site. Not ``no-referrer``: with it a browser sends ``Origin: null`` on the
  console's own form posts, which the Origin check refuses.
- ``Strict-Transport-Security`` when the request came over https (never over plain http,
  where a browser ignores it and it would only lie).
- ``Cache-Control: no-store`` on everything but the static files: a page shows what a
  session may see, and must not stay in a shared or back-button cache after logout."""

from __future__ import annotations

from typing import Any

CSP = "; ".join((
    "default-src 'none'", "script-src 'self'", "style-src 'self'", "style-src-elem 'self'",
    "style-src-attr 'unsafe-inline'", "img-src 'self' data:", "connect-src 'self'", "font-src 'self'",
    "form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'", "object-src 'none'"))
HSTS_S = 365 * 86400
STATIC = "/ui/static/"

Headers = list[tuple[bytes, bytes]]


def security_headers(*, https: bool, static: bool) -> Headers:
    h = [(b"content-security-policy", CSP.encode()), (b"x-frame-options", b"DENY"),
         (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin")]
    if https:
        h.append((b"strict-transport-security", f"max-age={HSTS_S}".encode()))
    if not static:
        h.append((b"cache-control", b"no-store"))
    return h


def wrap(scope: dict[str, Any], send):  # type: ignore[no-untyped-def]
    """``send`` that adds the headers to the response's start (replacing any of the same
    name a route set)."""
    add = security_headers(https=scope.get("scheme") == "https", static=scope["path"].startswith(STATIC))
    names = {k for k, _ in add}

    async def send_secure(msg):  # type: ignore[no-untyped-def]
        if msg["type"] == "http.response.start":
            msg = {**msg, "headers": [(k, v) for k, v in msg.get("headers", []) if k.lower() not in names] + add}
        await send(msg)
    return send_secure
