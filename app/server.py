"""The server: Panel dashboard, REST API and WebSockets on one Tornado loop and one port.

The dashboard authenticates with the same API tokens as REST: the login form exchanges a token for a
server-side session (``services.sessions``) whose id travels in a signed, HttpOnly, SameSite=Strict cookie
(never the token's secret). Signing out, idling past the idle timeout, the session's lifetime or revoking
the token ends it. Cookie-authenticated REST changes carry the session's own XSRF token. Every response
carries the security headers below (CSP, nosniff, Referrer-Policy, HSTS over HTTPS).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import html
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import panel as pn
import tornado.httputil
import tornado.web
from bokeh.server.auth_provider import AuthProvider

from app.api.pages import Page
from app.api.sandbox import sandbox_pages, sandbox_routes
from app.bootstrap import Services
from app.edge import edge_patterns, guard_application, http_server_limits, record_answer, use_access_log
from app.fast_reads import use_fast_reads
from app.rest import SESSION_COOKIE, XSRF_COOKIE, NotFoundHandler, allowed_origins, rest_patterns, sign_in
from app.routes import PAGES, ROUTES
from app.runtime import RUNTIME_FILE, Runtime, remove_runtime, url_for, write_runtime
from app.sandbox import Sandbox, sandbox_enabled
from app.secret_files import secret_file
from services.auth import Principal, Role
from services.errors import Permanent, ServiceError
from services.sandbox_control import SandboxControl
from services.settings import LOOPBACK_HOSTS

log = logging.getLogger(__name__)

LOGIN_URL = "/login"
LOGOUT_URL = "/logout"


def cookie_secret(data_dir: Path) -> str:
    """A per-installation secret for signed cookies, made once and kept 0600 in the data dir."""
    return secret_file(data_dir / "cookie_secret", 48)


LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>InstantStart · sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body {{ font-family: system-ui, sans-serif; background: #f4f6f8; display: grid; place-items: center;
        min-height: 100vh; margin: 0; }}
 form {{ background: white; padding: 2rem; border-radius: 8px; box-shadow: 0 1px 4px #0002; width: 22rem; }}
 h1 {{ font-size: 1.3rem; margin-top: 0; }} label {{ display: block; margin-bottom: .4rem; }}
 input[type=password] {{ width: 100%; padding: .5rem; box-sizing: border-box; font-family: monospace; }}
 button {{ margin-top: 1rem; padding: .5rem 1.2rem; background: #1f6feb; color: white; border: 0;
          border-radius: 4px; cursor: pointer; }}
 .error {{ color: #b42318; }} .hint {{ color: #555; font-size: .85rem; }}
</style></head>
<body><form method="post" action="{action}">
<h1>InstantStart</h1>
{xsrf}
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus required>
<p class="error" role="alert">{error}</p>
<button type="submit" id="login">Sign in</button>
<p class="hint">The first start printed an admin token. Make more with
<code>instantstart token create --role viewer</code>.</p>
</form></body></html>"""


#: the dashboard's policy: Bokeh and Panel render with inline scripts, load bundles through blob: URLs and
#: compile code at run time (without 'unsafe-eval' the page stays blank), so scripts are limited to this
#: origin plus those; nothing may frame the page, load plugins or rebase URLs
DASHBOARD_CSP = ("default-src 'self'; script-src 'self' blob: 'unsafe-inline' 'unsafe-eval'; "
                 "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self' data:; "
                 "connect-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'self'; "
                 "form-action 'self'; frame-ancestors 'none'")
#: the sign-in page runs no script at all
LOGIN_CSP = ("default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
             "object-src 'none'; base-uri 'self'; frame-ancestors 'none'")
HSTS = "max-age=31536000"


class SecurityHeaders(tornado.web.OutputTransform):
    """Adds the security headers to every response of the server (Panel's handlers and ours alike); a
    handler that set its own Content-Security-Policy keeps it."""

    def __init__(self, request: tornado.httputil.HTTPServerRequest) -> None:
        super().__init__(request)
        self.https = request.protocol == "https"

    def transform_first_chunk(self, status_code: int, headers: tornado.httputil.HTTPHeaders, chunk: bytes,
                              finishing: bool) -> tuple[int, tornado.httputil.HTTPHeaders, bytes]:
        if "Content-Security-Policy" not in headers:
            headers["Content-Security-Policy"] = DASHBOARD_CSP
        headers["X-Content-Type-Options"] = "nosniff"
        headers["Referrer-Policy"] = "same-origin"
        if self.https:
            headers["Strict-Transport-Security"] = HSTS
        return status_code, headers, chunk


def _is_secure(handler: tornado.web.RequestHandler) -> bool:
    # Browsers treat loopback as a secure context, so a Secure cookie works there over plain http too.
    return handler.request.protocol == "https" or handler.request.host_name.strip("[]") in LOOPBACK_HOSTS


def safe_next(target: str) -> str:
    """Only a path on this server: '//evil.example' or '/\\evil' would leave it."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def make_auth_provider(services: Services) -> AuthProvider:
    max_age_days = services.settings.session_lifetime / 86_400

    class LoginHandler(tornado.web.RequestHandler):
        def get(self) -> None:
            self._page("")

        async def post(self) -> None:
            try:
                self.check_xsrf_cookie()
            except tornado.web.HTTPError:
                self.set_status(403)
                self._page("the sign-in form expired; please try again")
                return
            if not _is_secure(self):
                self.set_status(403)
                self._page("sign in over HTTPS, or through localhost (e.g. SSM port forwarding): the session "
                           "cookie is Secure and would not be kept over plain HTTP")
                return
            token = self.get_body_argument("token", "").strip()
            loop = asyncio.get_running_loop()
            try:
                principal = await sign_in(services, token, self.request.remote_ip or "", face="ui", client="",
                                          action="session.login", target="dashboard")
            except ServiceError as exc:
                self.set_status(exc.http_status)  # 401, or 429 when too many failures of this token wait
                self._page(exc.message)
                return
            session = await loop.run_in_executor(None, services.sessions.open, principal)
            self.set_signed_cookie(SESSION_COOKIE, session.id, expires_days=max_age_days, httponly=True,
                                   samesite="Strict", secure=True)
            # readable by the dashboard's own pages, which echo it in X-XSRFToken for changes
            self.set_cookie(XSRF_COOKIE, session.xsrf, expires_days=max_age_days, samesite="Strict", secure=True)
            await loop.run_in_executor(None, services.audit.record, principal, "session.login", "dashboard", {},
                                       "succeeded")
            self.redirect(safe_next(self.get_argument("next", "/")))

        def _page(self, error: str) -> None:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Content-Security-Policy", LOGIN_CSP)
            self.set_header("Cache-Control", "no-store")
            self.finish(LOGIN_PAGE.format(action=LOGIN_URL, xsrf=self.xsrf_form_html(),
                                          error=html.escape(error)))

    class LogoutHandler(tornado.web.RequestHandler):
        async def get(self) -> None:
            """End the session on the server, so a copy of its cookie opens nothing afterwards."""
            raw = self.get_signed_cookie(SESSION_COOKIE, max_age_days=max_age_days)
            if raw:
                loop = asyncio.get_running_loop()
                try:
                    principal = await loop.run_in_executor(None, services.sessions.principal, raw.decode(), "ui")
                except ServiceError:
                    principal = None  # already ended: nothing to record
                if principal is not None and await loop.run_in_executor(None, services.sessions.end, raw.decode()):
                    await loop.run_in_executor(None, services.audit.record, principal, "session.logout",
                                               "dashboard", {}, "succeeded")
            self.clear_cookie(SESSION_COOKIE)
            self.clear_cookie(XSRF_COOKIE)
            self.redirect(LOGIN_URL)

    def get_user(handler: tornado.web.RequestHandler) -> str | None:
        raw = handler.get_signed_cookie(SESSION_COOKIE, max_age_days=max_age_days)
        if not raw:
            return None
        try:
            return services.sessions.principal(raw.decode(), "ui").token_id
        except ServiceError:
            return None

    class TokenAuth(AuthProvider):
        @property
        def get_user(self) -> Callable[[Any], str | None]:  # type: ignore[override]  # bokeh wants a User
            return get_user

        @property
        def login_url(self) -> str:
            return LOGIN_URL

        @property
        def login_handler(self) -> type[tornado.web.RequestHandler]:
            return LoginHandler

        @property
        def logout_url(self) -> str:
            return LOGOUT_URL

        @property
        def logout_handler(self) -> type[tornado.web.RequestHandler]:
            return LogoutHandler

    return TokenAuth()


def session_principal(services: Services, secret: str) -> Principal:
    """Who owns this dashboard session, read again from the signed session cookie.

    Bokeh hands the cookies of the request that opened the session to the session; the auth provider
    already checked them, and the session is looked up once more here so an ended one opens nothing.
    (``pn.state.user`` would read Panel's own ``user``/``is_guest`` cookies, which this server never sets.)
    """
    from tornado.web import decode_signed_value

    from services.errors import Unauthorized

    if services.settings.dev_no_auth:
        return Principal("dev", Role.ADMIN, None, "ui")
    raw = pn.state.cookies.get(SESSION_COOKIE)
    session = decode_signed_value(secret, SESSION_COOKIE, raw,
                                  max_age_days=services.settings.session_lifetime / 86_400) if raw else None
    if not session:
        raise Unauthorized("no valid dashboard session; sign in again")
    return services.sessions.principal(session.decode(), "ui")


def make_dashboard(services: Services, pages: list[Page] = PAGES) -> Callable[[], Any]:
    from panel.theme.fast import Fast as FastDesign

    class Fast(FastDesign):
        """Panel's Fast design minus its Google Fonts stylesheet: the served page needs no internet.

        Named ``Fast`` on purpose: Panel serves a design's local files under its lower-cased class name.
        """

        _resources = {key: value for key, value in FastDesign._resources.items()  # type: ignore[assignment]
                      if key != "font"}

    secret = cookie_secret(services.settings.data_dir)  # read once, not for every session

    def dashboard() -> Any:
        principal = session_principal(services, secret)
        allowed = [p for p in pages if principal.allows(p.role)]
        main = pn.Column(sizing_mode="stretch_both")
        buttons: dict[str, pn.widgets.Button] = {}
        built: dict[str, Any] = {}  # one pane per page per session: revisiting keeps its state and subscription

        def show(slug: str) -> None:
            page = next(p for p in allowed if p.slug == slug)
            if slug not in built:
                built[slug] = page.build(services, principal)
            main.objects = [built[slug]]
            for key, button in buttons.items():
                button.color = "primary" if key == slug else "default"
            if pn.state.location is not None:  # each page has a URL: reloads and links land on it
                pn.state.location.search = f"?page={slug}"

        for page in allowed:
            button = pn.widgets.Button(label=page.title, color="default", sizing_mode="stretch_width",
                                       css_classes=["nav", f"nav-{page.slug}"])
            button.on_click(functools.partial(lambda slug, _event: show(slug), page.slug))
            buttons[page.slug] = button
        asked = (pn.state.session_args.get("page") or [b""])[0].decode(errors="replace")
        show(asked if asked in buttons else allowed[0].slug)
        who = pn.pane.Markdown(f"Signed in as **{html.escape(principal.name)}** ({principal.role.value})"
                               + ("" if services.settings.dev_no_auth else
                                  f" · [sign out]({LOGOUT_URL.lstrip('/')})"),
                               css_classes=["whoami"])
        template = pn.template.FastListTemplate(
            title="InstantStart", sidebar=[who, *buttons.values()], main=[main],
            header_background="#232f3e", accent_base_color="#ff9900", theme_toggle=False,
            design=Fast, font="system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
        )
        return template

    return dashboard


#: young collections every this many net allocations (CPython's default is 700): a cached read allocates ~100
GC_YOUNG_THRESHOLD = 10_000
DRAIN_SECONDS = 30.0  # how long shutdown waits for verb calls under way (a describe, a bounded AWS retry)


def settle_heap() -> None:
    """Keep the cyclic garbage collector off the request path. What start-up made (modules, Panel and Bokeh
    models, pydantic schemas, boto3 clients: ~180,000 objects) lives as long as the process, yet every full
    collection walked all of it — measured under ``wrk``: one 0.7 s stall of the event loop every ~10 s,
    every open request waiting for it. ``gc.freeze()`` moves it out of the collector's sight, so a full
    collection walks only what was made since; young collections run less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run_guarded(server: Any, listening: Callable[[int], None]) -> None:
    """Start Panel's (Bokeh's) server with every handler guarded (see app/edge.py), tell ``listening`` its
    port, then serve until interrupted."""
    guard_application(server._tornado)
    settle_heap()
    server.start()
    listening(server.port)
    server.io_loop.start()


def serve_workers(server: Any) -> ThreadPoolExecutor:
    """The threads REST handlers run verb calls on (the loop's default executor), held so shutdown can wait
    for them."""
    workers = ThreadPoolExecutor(thread_name_prefix="verb")
    server.io_loop.asyncio_loop.set_default_executor(workers)
    return workers


def drain_workers(server: Any, workers: ThreadPoolExecutor, timeout: float = DRAIN_SECONDS) -> None:
    """Once the loop has stopped: stop listening, then wait up to ``timeout`` seconds for the verb calls under
    way on ``workers`` (queued ones are dropped), so the services close their database connections only after
    the last of them returned; past it, say which were still running and close anyway."""
    with contextlib.suppress(AssertionError):  # Bokeh asserts it was not stopped already
        server.stop(wait=False)
    waiter = threading.Thread(target=workers.shutdown, kwargs={"cancel_futures": True}, daemon=True)
    waiter.start()
    waiter.join(timeout)
    if waiter.is_alive():
        log.warning("shutting down with verb calls still running after %.0f s", timeout)


def serve(services: Services, *, show_token: Callable[[str], None] | None = None,
          say: Callable[[str], None] = log.info, mode_reason: str = "") -> None:
    """Start everything on one port and block until interrupted; ``say`` prints start-up facts.

    Once listening, the actual URL and sandbox endpoints go to the runtime file (``app/runtime.py``), which
    every CLI command reads; it is removed on the way out."""
    settings = services.settings
    settings.check_bind()
    world: Sandbox | None = None
    server: Any = None
    workers: ThreadPoolExecutor | None = None
    try:
        # start-up order: the data directory's lock, then the sandbox reachable, then (registry loaded at
        # build time) the engine resumes operations, so a resumed stage finds its cluster's endpoints
        services.lock()
        routes = ROUTES
        pages = PAGES
        if sandbox_enabled(settings):
            world = Sandbox(settings)
            world.start()  # a child process; returns once it answers
            control = SandboxControl(world, services.audit, services.bus)
            routes = ROUTES + sandbox_routes(control)
            pages = [*PAGES, *sandbox_pages(control)]
            info = world.info()
            say(f"sandbox mode ({mode_reason or 'sandbox enabled'}): account {info['account_id']}, region "
                f"{info['region']}, AWS endpoint {info['aws_endpoint_url']} (aws --endpoint-url), Kubernetes "
                f"{info['kubernetes_url']}, kubeconfigs in {info['kubeconfig_dir']} (instantstart sandbox info)")
        else:
            say(f"AWS mode ({mode_reason or 'sandbox disabled'}): region {settings.region}")
        services.start()
        token = services.tokens.bootstrap_admin()
        if token and show_token is not None:
            show_token(token)
        pn.extension("tabulator", notifications=True)
        # Bokeh's own origin check cannot parse bracketed IPv6 hosts; REST and events accept them
        origins = sorted(o for o in allowed_origins(settings) if not o.startswith("["))
        kwargs: dict[str, Any] = {}
        if not settings.dev_no_auth:
            kwargs["auth_provider"] = make_auth_provider(services)
        server = pn.serve(
            {"/": make_dashboard(services, pages)},
            port=settings.port,
            address=settings.host,
            websocket_origin=origins,
            show=False,
            start=False,
            title="InstantStart",
            verbose=False,
            extra_patterns=[*rest_patterns(services, routes), *edge_patterns(NotFoundHandler)],
            cookie_secret=cookie_secret(settings.data_dir),
            use_xheaders=settings.trust_proxy_headers,
            http_server_kwargs=http_server_limits(),
            transforms=[SecurityHeaders],
            **kwargs,
        )

        if world is not None:  # the sandbox died under us: stop serving, and say why
            world.on_exit = lambda _reason: server.io_loop.add_callback(server.io_loop.stop)

        def listening(port: int) -> None:
            write_runtime(Runtime(
                pid=os.getpid(), url=url_for(settings.host, port), data_dir=str(settings.data_dir),
                sandbox=world is not None, mode_reason=mode_reason,
                aws_endpoint_url=world.aws_endpoint_url if world else None,
                kube_url=world.kube_base_url if world else None,
                ports={"port": port, "sandbox_aws_port": settings.sandbox_aws_port,
                       "sandbox_kube_port": settings.sandbox_kube_port},
                started_at=time.time(), region=settings.region))
            say(f"listening on {url_for(settings.host, port)} (runtime file {settings.data_dir / RUNTIME_FILE})")

        use_access_log(server._tornado, services.engine.metrics)
        use_fast_reads(server._tornado, services, routes, functools.partial(record_answer, services.engine.metrics))
        workers = serve_workers(server)
        run_guarded(server, listening)
        if world is not None and world.exit_reason:
            raise Permanent(f"stopped: {world.exit_reason}")
    finally:
        remove_runtime(settings.data_dir)
        try:
            if workers is not None:
                drain_workers(server, workers)
        finally:
            try:
                services.stop()  # the engine and informers first, while the sandbox still answers
            finally:
                if world is not None:
                    world.stop()
