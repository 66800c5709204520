"""The dashboard in a real headless Chromium, for the browser tests: the browser (skipped, or failed
under CI, where Chromium, its driver or Selenium is missing), tokens and a REST client with auth
on, and `Page`, the page as a test drives it (waits that explain a timeout with a screenshot and
what the page showed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.clusters import Rest
from tests.servers import IN_CI

CHROMIUM = Path(os.environ.get("HEADRACE_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("HEADRACE_CHROMEDRIVER", "/usr/bin/chromedriver"))


def _unavailable() -> str | None:
    if not CHROMIUM.exists():
        return f"Chromium is not installed ({CHROMIUM}; Debian package chromium)"
    if not CHROMEDRIVER.exists():
        return f"chromedriver is not installed ({CHROMEDRIVER}; Debian package chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the Python package selenium is not installed (pip install selenium)"
    if not shutil.which("redis-server"):
        return "redis-server is not installed"
    return None


_why = _unavailable()
if _why:
    if IN_CI:
        pytest.fail(f"browser tests need it in CI: {_why}", pytrace=False)
    pytest.skip(f"browser tests skipped: {_why}", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException, TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

PAGE_WAIT_S = 15  # the page polls once a second
JOB_WAIT_S = 120  # a Spark driver starts in 20-40 s on a busy 2-core machine


@pytest.fixture(scope="module")
def tokens(cluster) -> dict[str, str]:
    from shared.catalog import Catalog
    from shared.catalog import tokens as catalog_tokens

    catalog = Catalog(cluster.settings.catalog)
    try:
        with catalog.session() as s:
            return {role: catalog_tokens.create(s, role, f"browser-{role}")[1] for role in ("viewer", "admin")}
    finally:
        catalog.dispose()


@pytest.fixture(scope="module")
def api(cluster, tokens) -> Rest:
    """For checking the page's claims against the server, never for driving the scenario."""
    rest = Rest(cluster.dispatcher_url)
    rest.http.headers["Authorization"] = f"Bearer {tokens['admin']}"
    return rest


@pytest.fixture(scope="module")
def browser(cluster):
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager would otherwise try to download one (offline here).
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    driver.console = []  # browser log entries read so far (reading the log empties it)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    def __init__(self, driver, shots: Path):
        self.d = driver
        self.shots = shots

    def wait(self, what: str, condition, timeout_s: float = PAGE_WAIT_S):
        try:
            return WebDriverWait(
                self.d, timeout_s, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
            ).until(lambda d: condition(d))
        except TimeoutException:
            # What the page showed instead, so a CI failure explains itself.
            shot = self.shots / f"timeout-{len(list(self.shots.iterdir()))}.png"
            self.d.save_screenshot(str(shot))
            shown = self.d.execute_script("return document.body.innerText.slice(0, 1500)")
            errors = [e["message"] for e in self.console() if e.get("level") == "SEVERE"][-5:]
            raise AssertionError(
                f"{what} not seen within {timeout_s} s at {self.d.current_url}; screenshot {shot}; "
                f"console errors {errors}; the page shows:\n{shown}"
            ) from None

    def go(self, hash_: str) -> None:
        self.d.execute_script("window.location.hash = arguments[0]", hash_)

    def el(self, css: str):
        return self.d.find_element(By.CSS_SELECTOR, css)

    def els(self, css: str):
        return self.d.find_elements(By.CSS_SELECTOR, css)

    def attributes(self, css: str, name: str) -> list[str | None]:
        """One attribute of every match, read in one step: the page re-renders its tables
        every few seconds, and an element found in one call may be gone by the next."""
        return self.d.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), e => e.getAttribute(arguments[1]))", css, name
        )

    def text(self, css: str) -> str:
        found = self.els(css)
        return found[0].text if found else ""

    def visible(self, css: str) -> bool:
        found = self.els(css)
        return bool(found) and found[0].is_displayed()

    def accept_confirm(self) -> None:
        WebDriverWait(self.d, 5).until(EC.alert_is_present(), message="no confirm dialog")
        try:
            self.d.switch_to.alert.accept()
        except NoAlertPresentException:  # pragma: no cover - accepted meanwhile
            pass

    def xss(self):
        return self.d.execute_script("return window.__xss")

    def console(self) -> list[dict]:
        try:
            self.d.console.extend(self.d.get_log("browser"))
        except Exception:  # noqa: BLE001 - a driver without the log endpoint: nothing to read
            pass
        return self.d.console

    def sign_in(self, token: str) -> str:
        self.wait("the sign-in dialog", lambda d: self.visible("#signin"))
        field = self.el("#signin-token")
        field.clear()
        field.send_keys(token)
        self.el("#signin-submit").click()
        self.wait("the dialog closing after sign-in", lambda d: not self.visible("#signin"))
        return self.wait("the role after sign-in", lambda d: self.text("#auth-state"))

    def submit(self, directory: Path, filename: str, source: str, *, name: str, restart: str | None = None) -> str:
        path = directory / filename
        path.write_text(source)
        self.go("#/submit")
        self.wait("the submit page", lambda d: self.visible("#submit-form"))
        self.el("#f-file").send_keys(str(path))
        name_field = self.el("#f-name")
        name_field.clear()
        name_field.send_keys(name)
        if restart:
            self.el(f"#f-restart option[value='{restart}']").click()
        self.el("#f-submit").click()
        link = self.wait("the submitted job's link", lambda d: self.els("#f-message.ok #f-job-link"), timeout_s=60)[0]
        return link.text
