"""Headless Chromium from Debian's packages, driven by Selenium through /usr/bin/chromedriver.

Nothing is downloaded: the driver path and the browser binary are given explicitly, so
selenium-manager is never consulted. Without Chromium the browser tests skip on a developer's
machine; NEXUSCRM_BROWSER_REQUIRED=1 or NEXUSCRM_TIDB_REQUIRED=1 (CI sets both) makes that a
failure, since these tests also run against the database.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
REQUIRED = "1" in (os.environ.get("NEXUSCRM_BROWSER_REQUIRED"), os.environ.get("NEXUSCRM_TIDB_REQUIRED"))
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1700",
)
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


def chromium(user_data_dir: Path) -> webdriver.Chrome:
    """A fresh headless Chromium with browser console logging on."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={user_data_dir}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))


def browser_session() -> Iterator[webdriver.Chrome]:
    """Body of the ``browser`` fixture: skip (or fail when required) without Chromium."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        message = f"{CHROMIUM} and {CHROMEDRIVER} are needed (Debian packages chromium, chromium-driver)"
        if REQUIRED:
            pytest.fail(f"browser tests are required here: {message}")
        pytest.skip(message)
    with tempfile.TemporaryDirectory(prefix="nexuscrm-chromium-") as profile:
        driver = chromium(Path(profile))
        try:
            yield driver
        finally:
            driver.quit()


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """Browser console entries of level SEVERE since the last call."""
    entries: list[dict[str, str]] = driver.get_log("browser")  # type: ignore[no-untyped-call]  # untyped upstream
    return [entry["message"] for entry in entries if entry["level"] == "SEVERE"]
