"""Drives the operator console in Debian's Chromium (Playwright for Python), against the
`agentjail serve` that crates/cli/tests/console.rs started. Exits non-zero on the first
failed check (an AssertionError with what was seen).

Environment: BASE (http://127.0.0.1:PORT), OPS_TOKEN (an operator's), TENANT_TOKEN (a
tenant's, not an operator), XSS_RUN (a run of tenant acme whose stdout, stderr, output file
names and denials carry HTML/JS payloads), UNKNOWN_RUN (an `unknown` run of acme),
CHROMIUM (default /usr/bin/chromium), AXE (axe.min.js), SHOTS (a folder for the screenshots;
optional).
"""

import json
import os
import sys
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

BASE = os.environ["BASE"]
OPS = os.environ["OPS_TOKEN"]
TENANT = os.environ["TENANT_TOKEN"]
XSS_RUN = os.environ["XSS_RUN"]
UNKNOWN_RUN = os.environ["UNKNOWN_RUN"]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
AXE = os.environ["AXE"]
SHOTS = os.environ.get("SHOTS")
HOST = BASE.split("://", 1)[1]
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def http(method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# --- Over plain HTTP: headers, the login's refusals, no console route without a session. ----

for path in ["/console", "/console/", "/console/app.js", "/console/style.css", "/console/api/runs", "/console/nope"]:
    status, h, _ = http("GET", path)
    check(h.get("Content-Security-Policy") == CSP, f"{path}: CSP {h.get('Content-Security-Policy')!r}")
    check(h.get("X-Content-Type-Options") == "nosniff", f"{path}: no nosniff")
status, _, body = http("GET", "/console")
check(b"<script" not in body.split(b'<script type="module" src="/console/app.js"></script>', 1)[1], "a second script in index.html")
check(b"style=" not in body and b"<style" not in body, "inline style in index.html")

same = {"Origin": BASE, "Sec-Fetch-Site": "same-origin"}
status, h, _ = http("POST", "/console/login", {"token": TENANT}, same)
check(status == 403 and "Set-Cookie" not in h, f"a tenant's token logged in: {status}")
status, h, _ = http("POST", "/console/login", {"token": OPS}, {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
check(status == 403 and "Set-Cookie" not in h, f"a cross-site login was accepted: {status}")
status, _, _ = http("POST", "/console/login", {"token": "not-a-token"}, same)
check(status == 401, f"a wrong token: {status}")

api_routes = [
    ("GET", "/console/api/session", None),
    ("GET", "/console/api/runs", None),
    ("GET", f"/console/api/runs/acme/{XSS_RUN}", None),
    ("GET", "/console/api/decisions", None),
    ("GET", "/console/api/denials", None),
    ("GET", "/console/api/audit", None),
    ("GET", "/console/api/health", None),
    ("GET", "/console/api/fleet", None),
    ("POST", f"/console/api/runs/acme/{UNKNOWN_RUN}/reconcile", {"action": "abandon"}),
    ("POST", "/console/api/logout", None),
]
for token in [TENANT, OPS]:
    for method, path, body in api_routes:
        status, _, _ = http(method, path, body, {"Authorization": "Bearer " + token, **same})
        check(status == 401, f"{method} {path} with a bearer token (not a console session): {status}")

# An operator's session over plain HTTP, to attack its CSRF checks.
status, h, body = http("POST", "/console/login", {"token": OPS}, same)
check(status == 200, f"the operator's login: {status}")
cookie = h["Set-Cookie"]
for flag in ["HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age="]:
    check(flag in cookie, f"cookie without {flag}: {cookie}")
check("Secure" not in cookie, "Secure over plain HTTP (the browser would drop it)")
csrf = json.loads(body)["csrf"]
sid = cookie.split(";", 1)[0]
rec = f"/console/api/runs/acme/{UNKNOWN_RUN}/reconcile"
for name, headers in [
    ("no CSRF token", {"Cookie": sid, **same}),
    ("a wrong CSRF token", {"Cookie": sid, "X-CSRF-Token": "0" * 64, **same}),
    ("a cross-site Origin", {"Cookie": sid, "X-CSRF-Token": csrf, "Origin": "http://evil.example"}),
    ("Sec-Fetch-Site cross-site", {"Cookie": sid, "X-CSRF-Token": csrf, "Origin": BASE, "Sec-Fetch-Site": "cross-site"}),
]:
    status, _, _ = http("POST", rec, {"action": "abandon"}, headers)
    check(status == 403, f"reconcile with {name}: {status}")
# Another tenant's run is not the operator's to read or reconcile (as in the API).
for method, path, body in [("GET", "/console/api/runs/globex/other-1", None), ("POST", "/console/api/runs/globex/other-1/reconcile", {"action": "abandon"})]:
    status, _, _ = http(method, path, body, {"Cookie": sid, "X-CSRF-Token": csrf, **same})
    check(status == 403, f"{method} {path}, another tenant's run: {status}")
status, _, body = http("GET", "/console/api/audit?q=other-1", None, {"Cookie": sid})
check(status == 200 and json.loads(body)["records"] == [], f"another tenant's audit records: {body[:300]!r}")
status, _, body = http("GET", "/console/api/audit?q=xss-1", None, {"Cookie": sid})
check(status == 200 and json.loads(body)["records"], "the tenant's own audit records are missing")
status, h, _ = http("POST", "/console/login", {"token": OPS}, {**same, "X-Forwarded-Proto": "https"})
check("Secure" in h.get("Set-Cookie", ""), "no Secure behind a TLS proxy")
status, _, _ = http("POST", "/console/api/logout", None, {"Cookie": sid, "X-CSRF-Token": csrf, **same})
check(status == 204, f"logout: {status}")
status, _, _ = http("GET", "/console/api/runs", None, {"Cookie": sid})
check(status == 401, f"the session outlived its logout: {status}")

# --- In the browser. ------------------------------------------------------------------------

axe_src = open(AXE, encoding="utf-8").read()
seen = {"dialogs": [], "csp": [], "errors": []}


def axe(page, what):
    page.evaluate(axe_src + "\n;0")
    r = page.evaluate("async () => (await axe.run(document)).violations.map(v => ({id: v.id, impact: v.impact, n: v.nodes.length}))")
    bad = [v for v in r if v["impact"] in ("serious", "critical")]
    check(not bad, f"axe on {what}: {bad}")


def shot(page, name):
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, name + ".png"))


def not_pwned(page, what):
    check(page.evaluate("window.__pwned === undefined"), f"a payload ran on {what}")
    check(page.evaluate("document.scripts.length") == 1, f"a script element was injected on {what}")
    check(page.evaluate("document.querySelectorAll('main img, main iframe, main object').length") == 0, f"markup was injected on {what}")
    check(not seen["dialogs"], f"a dialog opened: {seen['dialogs']}")
    check(not seen["csp"], f"the CSP blocked something (an injection attempt, or an inline script/style): {seen['csp']}")
    check(not seen["errors"], f"page errors: {seen['errors']}")


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    ctx = browser.new_context(viewport={"width": 1100, "height": 760})
    page = ctx.new_page()
    page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
    page.on("console", lambda m: "Content Security Policy" in m.text and seen["csp"].append(m.text))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))

    page.goto(BASE + "/console")
    page.wait_for_selector("#token")
    axe(page, "the login page")
    # A tenant's token is refused in the browser too, and leaves no session.
    page.fill("#token", TENANT)
    page.click("button[type=submit]")
    # The refusal itself (the page's own text also says the console is for operators): until
    # it shows, the refused request may still clear the token field under the next fill.
    page.wait_for_selector("p.error >> text=Refused: the console is for operators")
    check(not ctx.cookies(), f"a tenant's login left a cookie: {ctx.cookies()}")

    requested = []
    page.on("request", lambda r: requested.append(r.url))
    page.fill("#token", OPS)
    page.click("button[type=submit]")
    page.wait_for_selector("#runs table")
    cookies = ctx.cookies()
    check(len(cookies) == 1, f"cookies: {cookies}")
    c = cookies[0]
    check(c["httpOnly"] and c["sameSite"] == "Strict" and c["path"] == "/console", f"cookie flags: {c}")
    check(page.evaluate("document.cookie") == "", "the session cookie is readable by script")

    # A run appears live, over the runs list's events stream: the page reads the list again
    # when the run is registered, started and ended. Without the stream it would read it only
    # every 10 s, so the run must show up, and then end, well within that.
    check(page.evaluate("typeof EventSource") == "function", "no EventSource in the browser")
    page.wait_for_timeout(1000)  # the stream is open (the list was read once, at its start)
    live = "live-run-1"
    status, _, _ = http("POST", "/v1/runs?wait=false", {"request_id": live, "task": "xss", "inputs": [], "code": "import json, time; time.sleep(1); json.dump({}, open('/output/o.json', 'w'))"}, {"Authorization": "Bearer " + OPS})
    check(status in (200, 202), f"submitting {live}: {status}")
    page.wait_for_selector(f"#runs a:text-is('{live}')", timeout=7000)
    page.locator("#runs tr", has_text=live).locator("span.status-ok").wait_for(timeout=8000)
    check(any(u.endswith("/console/api/runs/events") for u in requested), f"the runs list did not follow its events stream: {requested}")
    axe(page, "Runs")
    shot(page, "runs")
    not_pwned(page, "Runs")

    # The run whose output carries payloads: its text is shown as text, nothing runs.
    page.click(f"#runs a:text-is('{XSS_RUN}')")
    page.wait_for_selector("#run-status")
    body = page.inner_text("main")
    for needle in ["<img src=x onerror=", "<script>", "javascript:"]:
        check(needle in body, f"the payload {needle!r} is not shown as text on the run page")
    check(page.locator(".denial-detail").count() > 0, "no denial on the run page")
    check("<img" in page.locator("pre[data-stream=stdout]").inner_text(), "stdout's payload is not in stdout")
    check("<script>" in page.locator("pre[data-stream=stderr]").inner_text(), "stderr's payload is not in stderr")
    check(page.locator("#receipt-check.status-ok").count() == 1, "the receipt does not verify")
    axe(page, "a run")
    shot(page, "run")
    page.evaluate("document.querySelector('.denial-detail').closest('table').previousElementSibling.scrollIntoView()")
    shot(page, "run-denials")
    not_pwned(page, "a run")

    # Needs a decision: abandon the unknown run, confirmed, then find its audit record.
    page.click("nav a[href='#/decisions']")
    card = page.locator(f"section[aria-label='Run {UNKNOWN_RUN}']")
    card.wait_for()
    axe(page, "Needs a decision")
    shot(page, "decisions")
    # Without the console's CSRF token the same action is refused, in the browser too.
    refused = page.evaluate(
        "async (u) => (await fetch(u, {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify({action: 'abandon'})})).status",
        f"/console/api/runs/acme/{UNKNOWN_RUN}/reconcile",
    )
    check(refused == 403, f"a reconcile without the CSRF token: {refused}")
    card.locator("button[data-action=abandon]").click()
    card.locator("button[data-confirm=abandon]").click()
    page.wait_for_selector("text=Nothing needs a decision.")
    not_pwned(page, "Needs a decision")

    page.click("nav a[href='#/audit']")
    page.wait_for_selector("#audit-verified.status-ok")
    page.fill("#audit-q", UNKNOWN_RUN)
    page.click("form[role=search] button")
    page.wait_for_selector(f"main[data-q='{UNKNOWN_RUN}']")
    row = page.locator("main table tbody tr", has_text="reconcile")
    row.first.wait_for()
    text = row.first.inner_text()
    check("abandon" in text and "ops" in text and "allow" in text, f"the reconcile's audit record: {text}")
    page.fill("#audit-q", "console_login")
    page.click("form[role=search] button")
    page.wait_for_selector("main[data-q='console_login']")
    page.locator("main table tbody tr", has_text="not an operator").first.wait_for()
    page.fill("#audit-q", "")
    page.click("form[role=search] button")
    page.wait_for_selector("main[data-q=''] table")
    axe(page, "Audit")
    shot(page, "audit")
    not_pwned(page, "Audit")

    page.click("nav a[href='#/denials']")
    page.wait_for_selector("svg.chart")
    check("<img src=x onerror=" in page.inner_text("main"), "the denials' payload is not shown as text")
    axe(page, "Denials")
    shot(page, "denials")
    not_pwned(page, "Denials")

    page.click("nav a[href='#/fleet']")
    page.wait_for_selector("text=One node with SQLite")
    axe(page, "Fleet")
    not_pwned(page, "Fleet")

    page.click("nav a[href='#/health']")
    page.wait_for_selector("text=Store reachable")
    # The host's isolation facts (`agentjail check`, read just after start-up).
    for _ in range(60):
        if page.locator("text=The isolation facts").count() > 0:
            break
        page.wait_for_timeout(500)
        page.reload()
        page.wait_for_selector("text=Store reachable")
    check(page.locator("text=The isolation facts").count() > 0, "the Health page shows no isolation facts")
    check(page.locator("text=A strict run").count() > 0, "the Health page does not say whether a strict run works")
    axe(page, "Health")
    shot(page, "health")
    not_pwned(page, "Health")

    page.click("#logout")
    page.wait_for_selector("#token")
    check(page.evaluate("async () => (await fetch('/console/api/runs')).status") == 401, "a session outlived the logout")
    browser.close()

print("console: every check passed")
sys.exit(0)
